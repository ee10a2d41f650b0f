"""One figure, one value: on every sample and real job, the verdict, the text headline, the HTML
headline, the attribution section, every finding's evidence, the gate's metrics and the diff
quote the same typical-step figures (the job model's); any other step time a view prints is
labelled as what it is; the findings together never recover more lost time than the typical
step loses (exposed communication + idle)."""

from __future__ import annotations

import re

import pytest

from analyzer.base.units import fmt_pct, fmt_us
from analyzer.compare.diff import diff_runs
from analyzer.compare.gate import GateConfig, evaluate, parse_assertion
from analyzer.compare.metrics import run_metrics
from analyzer.job.model import LEAVES
from analyzer.reports.html import build_view
from analyzer.reports.text import TextRenderer
from rule_cases_lib import diagnosed, sample_traces

JOBS = sorted(sample_traces())
# "<duration> step" where a view quotes a step time, and what may stand before it to say which
# step it is when it is not the typical one.
STEP_FIGURE = re.compile(r"(?P<before>\S+ \S+ )?(?P<figure>\d[\d,.]* (?:µs|ms|s)) (?P<what>typical step|step\b)")
LABELS = ("of its ", "of their ")


def typical_figures(result):
    model = result.model
    if model.typical is None:
        return None
    return model.step_time_us, 100 * model.exposed_share, 100 * model.idle_share


@pytest.mark.parametrize("job", JOBS)
def test_every_view_quotes_the_typical_step(job):
    result = diagnosed(job)
    figures = typical_figures(result)
    if figures is None:
        assert result.attribution is None
        assert "typical step" not in (result.verdict or "")
        return
    step, exposed_pct, idle_pct = figures
    typical = result.model.typical
    assert result.attribution["step_time_us"] == step and result.attribution["step"] == typical.step
    assert result.attribution["exposed_share"] == round(exposed_pct / 100, 4)
    # the verdict
    if result.findings or "typical step" in result.verdict:
        assert f"the {fmt_us(step)} typical step" in result.verdict, result.verdict
    # the text headline and its per-rank table
    text = TextRenderer().render(result)
    assert f"typical step {typical.step}: {fmt_us(step)} (mean over ranks)" in text
    assert f"Where the time of step {typical.step} goes" in text
    # the HTML headline
    headline = {h["label"]: h for h in build_view(result)["summary"]["headline"]}
    assert headline["step time"]["value"] == fmt_us(step)
    assert headline["step time"]["note"] == f"typical step {typical.step}, mean over ranks"
    assert headline["exposed communication"]["note"].startswith(f"{exposed_pct:.1f}% of the step")
    assert headline["GPU idle"]["note"].startswith(f"{idle_pct:.1f}% of the step")
    # every finding's evidence
    for finding in result.findings:
        if "step_time_us" in (finding.get("evidence") or {}):
            assert finding["evidence"]["step_time_us"] == pytest.approx(step, abs=0.05), finding["rule"]
    # the gate: the default aggregate is the verdict's figure, and a check reports it as such
    metrics = run_metrics(result)
    assert metrics["step_time_us"].typical == step
    assert metrics["exposed_comm_pct"].typical == pytest.approx(exposed_pct)
    assert metrics["idle_pct"].typical == pytest.approx(idle_pct)
    # overlap: the typical step's in the gate and the HTML headline alike (not the whole trace's)
    overlap = result.model.overlap_share
    assert (metrics["overlap_pct"].typical if "overlap_pct" in metrics else None) == \
        (None if overlap is None else pytest.approx(100 * overlap))
    assert headline["overlap"]["value"] == fmt_pct(None if overlap is None else 100 * overlap)
    assert headline["overlap"]["note"].endswith(f"typical step {typical.step}")
    config = GateConfig(assertions=tuple(parse_assertion(name, ["error", {"max": 1e12}], None)
                                         for name in ("step_time_us", "exposed_comm_pct", "idle_pct")))
    checks = {c.name: c for c in evaluate(result, config).checks}
    assert checks["step_time_us"].actual == step and checks["exposed_comm_pct"].actual == pytest.approx(exposed_pct)
    assert all(f"typical step {typical.step}" in c.message for c in checks.values())
    # the diff
    diff = diff_runs(result, result)
    assert diff["base"]["step_time_us"] == step and diff["step_time"]["base_step_time_us"] == step
    by_name = {m["metric"]: m for m in diff["metrics"]}
    assert by_name["step_time_us"]["base"] == step
    assert by_name["exposed_comm_pct"]["base"] == pytest.approx(exposed_pct)
    # its step-time split: the typical step's leaves under their own names (the verdict's
    # "exposed communication" is waiting + transfer, two rows here)
    rows = {c["component"]: c["base_us"] for c in diff["step_time"]["components"]}
    assert rows["exposed transfer"] == typical.leaves.exposed_transfer_us and "exposed communication" not in rows
    assert rows["compute only"] == typical.leaves.compute_only_us


@pytest.mark.parametrize("job", JOBS)
def test_any_other_step_time_is_labelled(job):
    """The text view and the finding cards: a step time that is not the typical step's says
    whose it is ("of its 98.8 ms step": the ranks the finding fired on)."""
    result = diagnosed(job)
    if result.model.typical is None:
        return
    typical = fmt_us(result.model.step_time_us)
    text = " ".join(TextRenderer().render(result).split())
    cards = " ".join(" ".join(c["summary"].split()) for c in build_view(result)["findings"].get("cards", []))
    for view in (text, cards, " ".join((result.verdict or "").split())):
        for quoted in STEP_FIGURE.finditer(view):
            if quoted["what"] == "typical step":
                assert quoted["figure"] == typical, (job, quoted.group(0))
            else:
                assert (quoted["before"] or "").endswith(LABELS), (job, quoted.group(0))


# A duration as the views print it, with the two words before it.
DURATION = re.compile(r"(?P<before>(?:\S+ ){0,2})(?P<figure>(?P<number>\d[\d,]*(?:\.\d+)?) (?P<unit>µs|ms|s))\b")
UNIT_US = {"µs": 1.0, "ms": 1e3, "s": 1e6}


@pytest.mark.parametrize("job", JOBS)
def test_the_typical_step_is_printed_one_way(job):
    """Wherever the verdict, the text report or a finding card prints the typical step's time,
    it is the one figure (``fmt_us``), never the same time rounded another way ("28% of 5.2 ms"
    for the 5.16 ms typical step, "the typical step is 3.2 ms" for 3.17 ms): a reader comparing
    the two would take them for two steps."""
    result = diagnosed(job)
    step = result.model.step_time_us
    if not step:
        return
    views = {"verdict": result.verdict or "", "text": TextRenderer().render(result),
             "cards": " ".join(c["summary"] for c in build_view(result)["findings"].get("cards", []))}
    for name, view in views.items():
        for quoted in DURATION.finditer(" ".join(view.split())):
            decimals = len(quoted["number"].partition(".")[2])
            same_time = round(step / UNIT_US[quoted["unit"]], decimals) == float(quoted["number"].replace(",", ""))
            if same_time:
                assert quoted["figure"] == fmt_us(step), (job, name, quoted.group(0))


@pytest.mark.parametrize("job", JOBS)
def test_findings_together_never_recover_more_than_the_step_loses(job):
    result = diagnosed(job)
    joint = result.recoverable
    typical = result.model.typical
    if joint is None:
        return
    lost = typical.leaves.exposed_us + typical.leaves.idle_us
    assert joint["lost_bound_us"] == pytest.approx(lost, abs=0.01)
    assert joint["lost_us"] <= lost + 0.05
    assert joint["joint_us"] <= joint["sum_us"] + 0.05
    assert joint["joint_us"] == pytest.approx(joint["lost_us"] + joint["compute_us"], abs=0.15)
    for claim in joint["findings"]:
        counted = sum(claim["counted_us"].values()) + sum(claim["shared_us"].values())
        assert counted == pytest.approx(claim["gain_us"], abs=0.2)
    if len(joint["findings"]) > 1:
        assert "together the findings recover about" in result.verdict


def test_shared_time_is_counted_once_and_said():
    """ddp_host_sync_stall: rank 3's host stalls 40.8 ms in a device sync (its GPU idles) and the
    other three wait for it. gpu-idle-host-bound and straggler-rank name the same lost time; the
    verdict counts it once (the idle leaf and the waiting leaf of the typical step) and says so."""
    result = diagnosed("synthetic/ddp_host_sync_stall")
    rules = {f["rule"] for f in result.findings}
    assert {"gpu-idle-host-bound", "straggler-rank"} <= rules
    joint = result.recoverable
    leaves = result.model.typical.leaves
    assert joint["sum_us"] > leaves.exposed_wait_us + leaves.idle_us
    assert joint["lost_us"] <= leaves.exposed_wait_us + leaves.idle_us + leaves.exposed_transfer_us + 0.05
    assert "not the" in result.verdict and "they claim the same" in result.verdict


COMPUTE_LEAVES = ("compute_only_us", "other_gpu_us")


def _printed_us(figure: str) -> float:
    number, unit = figure.split()
    return float(number.replace(",", "")) * UNIT_US[unit]


@pytest.mark.parametrize("job", JOBS)
def test_the_verdicts_recoverable_time_is_within_what_the_step_loses(job):
    """The figure the verdict gives as recoverable (the top finding's gain, or the findings'
    joint estimate when there are several) is the Result's, and beyond the compute it names
    (a slow rank's kernels, fp32 GEMMs: ``recovers`` compute only / other GPU) it is never more
    than the typical step's exposed communication + idle."""
    result = diagnosed(job)
    typical = result.model.typical
    verdict = " ".join((result.verdict or "").split())
    single = re.search(r"\(about (\S+ (?:µs|ms|s)) of the (\S+ \S+) typical step\)", verdict)
    if typical is None or single is None:
        return
    lost = typical.leaves.lost_us
    together = re.search(r"together the findings recover about (\S+ (?:µs|ms|s))", verdict)
    if together:
        joint = result.recoverable
        assert together[1] == fmt_us(joint["joint_us"])
        quoted, compute = joint["joint_us"], joint["compute_us"]
    else:
        top = next(f for f in result.findings if not f["title"].startswith("rule "))
        assert single[1] == fmt_us(top["estimated_gain_us"])
        quoted = top["estimated_gain_us"]
        compute = sum(v for leaf, v in (top.get("recovers") or {}).items() if leaf in COMPUTE_LEAVES)
    assert _printed_us(together[1] if together else single[1]) == pytest.approx(quoted, rel=0.005)
    assert quoted - compute <= lost + 0.2, (job, quoted, compute, lost)


def test_a_finding_that_gains_nothing_is_said_so():
    """fsdp2_tp_2d: fsdp-where-ddp-fits projects no gain at this scale (0 µs, the extra bytes
    hidden). Its card said "~0.0 ms/step" while the verdict said "no estimate of the gain", and
    it "recovered" waiting for late peers (the last leaf it names, given the whole zero)."""
    result = diagnosed("synthetic/fsdp2_tp_2d")
    finding = next(f for f in result.findings if f["rule"] == "fsdp-where-ddp-fits")
    assert finding["estimated_gain_us"] == 0.0 and finding["recovers"] == {"exposed_transfer_us": 0.0}
    step = fmt_us(result.model.step_time_us)
    assert f"(its estimated gain is 0.0 µs of the {step} typical step)" in " ".join(result.verdict.split())
    assert "no estimate" not in result.verdict
    assert "recovers:" not in TextRenderer().render(result)
    card = next(c for c in build_view(result)["findings"]["cards"] if c["rule"] == "fsdp-where-ddp-fits")
    assert card["recovers"] == ""


@pytest.mark.parametrize("job", ["synthetic/ddp_straggler", "synthetic/ddp_pageable_input",
                                 "synthetic/fsdp_no_prefetch", "real/param_dlrm_ddp_8rank"])
def test_breakdown_df_is_the_models_steps(job):
    """One row per rank × step with the model's role; the five leaves add up to the step, the
    idle by host activity and the queued rest to the idle leaf, the exposed communication by
    phase to waiting + transfer; the typical rows' means are the attribution's leaves."""
    result = diagnosed(job)
    df = result.breakdown_df()
    model = result.model
    assert len(df) == sum(len(r.steps) for r in result.ranks)
    for row in df.itertuples():
        step = model.rank(row.rank).step(row.step)
        assert row.role == step.role and row.step_time_us == step.step_time_us
        if step.leaves is None:
            continue
        assert sum(getattr(row, leaf) for leaf in LEAVES) == pytest.approx(row.step_time_us, abs=0.01)
        idle_parts = [getattr(row, c) for c in df.columns if c.startswith("idle_") and c != "idle_us"]
        assert sum(idle_parts) == pytest.approx(row.idle_us, abs=0.01), (row.rank, row.step)
        phases = [getattr(row, c) or 0.0 for c in df.columns if c.startswith("exposed_") and c.endswith(
            ("forward_us", "backward_us", "optimizer_us", "other_us"))]
        assert sum(phases) == pytest.approx(row.exposed_wait_us + row.exposed_transfer_us, abs=0.01)
    typical = df[df.role == "typical"]
    assert len(typical) == model.typical.ranks
    for leaf in LEAVES:
        assert typical[leaf].mean() == pytest.approx(model.typical.leaves.leaf(leaf), abs=0.01)


@pytest.mark.parametrize("job", JOBS)
def test_straggler_marks_only_where_a_straggler_finding_names_the_rank(job):
    """The browser test's check on five jobs, here on every job (the page's data: the per-rank
    bars' ▲ marks and the timeline's straggler lane come from these fields)."""
    result = diagnosed(job)
    named = {r for f in result.findings if f["rule"] == "straggler-rank" for r in f["ranks"]}
    view = build_view(result)
    bars = view["bars"]
    marked = {row["rank"] for row in bars.get("rows", []) if row.get("straggler")}
    assert marked == (named & {row["rank"] for row in bars.get("rows", [])}), job
    if bars.get("available"):
        assert set(bars["stragglers"]) == named, job
    lanes = {g["rank"] for g in view["timeline"].get("groups", []) if g["role"] == "straggler"}
    assert lanes <= named and len(lanes) <= 1, job
