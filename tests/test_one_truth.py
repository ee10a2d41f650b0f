"""One figure, one value: on every sample and real job, the verdict, the text headline, the HTML
headline, the attribution section, every finding's evidence, the gate's metrics and the diff
quote the same typical-step figures (the job model's); any other step time a view prints is
labelled as what it is; the findings together never recover more lost time than the typical
step loses (exposed communication + idle)."""

from __future__ import annotations

import re
from typing import Annotated

import pytest

from analyzer.base.units import fmt_pct, fmt_us
from analyzer.compare.diff import diff_runs
from analyzer.compare.gate import GateConfig, evaluate, parse_assertion
from analyzer.compare.metrics import run_metrics
from analyzer.job.model import LEAVES, leaf_names
from analyzer.reports.html import build_view
from analyzer.reports.text import TextRenderer
from analyzer.rules.evidence_types import Evidence, Us, label
from rule_cases_lib import SAMPLES as SAMPLES_DIR, diagnosed, sample_traces

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


@pytest.mark.parametrize("job", JOBS)
def test_each_finding_recovers_no_more_of_a_leaf_than_the_typical_step_holds(job):
    """A finding names the leaves *of the typical step* its fix gives back (issue 24): none of
    them more than that leaf holds there (mean over ranks), and together its whole gain.
    straggler-rank said it recovered 1,229 µs of GPU idle on ddp_entry_skew, whose typical step
    idles 63.7 µs, and a gain averaged over the steady steps (36.1 ms on ddp_straggler) of which
    the typical step's waiting holds 29.8 ms."""
    result = diagnosed(job)
    typical = result.model.typical
    for f in result.findings:
        gain, recovers = f.get("estimated_gain_us"), f.get("recovers") or {}
        if gain is None or typical is None:
            continue
        for leaf, us in recovers.items():
            assert us <= typical.leaves.leaf(leaf) + 0.05, (job, f["rule"], leaf, us, typical.leaves.leaf(leaf))
        assert sum(recovers.values()) == pytest.approx(gain, abs=0.1 * len(recovers)), (job, f["rule"], recovers)


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
    single = re.search(r"\(its estimated gain is about (\S+ (?:µs|ms|s)) of the (\S+ \S+) typical step\)", verdict)
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


def test_a_parameter_count_is_said_as_it_is():
    """fsdp2_tp_2d's model has 4.19 M parameters: fsdp-where-ddp-fits said "0.00 B parameters"
    (and that 67.1 MB fits in "0%" of the GPU). A count that is missing or zero says so."""
    from analyzer.base.units import fmt_count, fmt_params
    finding = next(f for f in diagnosed("synthetic/fsdp2_tp_2d").findings if f["rule"] == "fsdp-where-ddp-fits")
    psi = finding["evidence"]["parameters"]
    assert 4.1e6 < psi < 4.3e6
    assert finding["summary"].startswith(f"The model has {fmt_count(psi)} parameters: DDP's 16Ψ = 67.1 MB fits in 0.078% ")
    assert "0.00 B" not in finding["summary"] and " 0% " not in finding["summary"]
    assert [fmt_params(v) for v in (1.47e9, 4194304, 950_000, 512, None, float("nan"), 0, -3)] == [
        "1.47 B parameters", "4.19 M parameters", "950 K parameters", "512 parameters",
        "an unknown number of parameters", "an unknown number of parameters", "no parameters counted",
        "no parameters counted"]
    assert [fmt_count(v) for v in (6.71e9, 175e9, 12_345)] == ["6.71 B", "175 B", "12.3 K"]


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


@pytest.mark.parametrize("job", JOBS)
def test_the_verdict_names_the_gain_as_the_gain(job):
    """ddp_bucket_oversized: "a large all-reduce is exposed after backward (about 18.1 ms of the
    163.9 ms typical step)" read as 18.1 ms exposed, where 23.5 ms is exposed and 18.1 ms is the
    predicted gain. A duration the verdict quotes of the typical step says which figure it is."""
    result = diagnosed(job)
    verdict = " ".join((result.verdict or "").split())
    for quoted in re.finditer(r"\((?P<before>[^()]*?)(?P<figure>\S+ (?:µs|ms|s)) of the \S+ \S+ typical step\)", verdict):
        assert quoted["before"].startswith(("its estimated gain is", "no estimate")), (job, quoted.group(0))
    top = next((f for f in result.findings if f.get("estimated_gain_us")), None)
    if top is not None and result.model.step_time_us:
        assert f"its estimated gain is about {fmt_us(top['estimated_gain_us'])}" in verdict or \
            "together the findings recover" in verdict or top is not result.findings[0], (job, verdict)


def _tree_rows(text: str) -> dict[str, float]:
    """The time tree's rows as {name: µs}, and each split line of the exposed communication."""
    rows: dict[str, float] = {}
    for line in text.split("Where the time of step", 1)[1].split("\n\n", 1)[0].splitlines()[1:]:
        row = re.match(r"\s+[│ ]*[├└]─ (?P<name>.+?)\s{2,}(?P<value>\d[\d,.]* (?:µs|ms|s))", line)
        if row:
            rows[row["name"]] = _printed_us(row["value"])
            continue
        split = re.match(r"\s+│\s+(?P<title>by \w+): (?P<cells>.+)", line)
        if split:
            cells = re.findall(r"(\d[\d,.]* (?:µs|ms|s))", split["cells"])
            rows[split["title"]] = sum(_printed_us(c) for c in cells)
    return rows


@pytest.mark.parametrize("job", JOBS)
def test_a_split_is_drawn_under_what_it_splits(job):
    """The tree drew "by collective / by phase / by group" under "transfer" (4.40 ms on
    ddp_straggler) although they split all the exposed communication (34.2 ms): each split is
    drawn right under "exposed communication", and no child is larger than its parent."""
    result = diagnosed(job)
    if result.model.typical is None:
        return
    text = TextRenderer().render(result)
    rows = _tree_rows(text)
    exposed = rows["exposed communication"]
    lines = text.split("Where the time of step", 1)[1].splitlines()
    at = next(i for i, line in enumerate(lines) if "├─ exposed communication" in line)
    splits = [t for t in ("by collective", "by phase", "by group") if t in rows]
    assert [line.split(":")[0].strip(" │") for line in lines[at + 1:at + 1 + len(splits)]] == splits, job
    for title in splits:
        assert rows[title] <= exposed * 1.005 + 0.1, (job, title, rows[title], exposed)
    assert rows["waiting for late peers"] + rows["transfer"] <= exposed * 1.005 + 0.1


@pytest.mark.parametrize("job", JOBS)
def test_the_top_collectives_say_which_steps_they_rank(job):
    """ddp_straggler: the breakdown leaves out the drain step 7 and "Top 5 collectives by exposed
    time" listed only step 7's: a list showing a step the breakdown leaves out says so."""
    result = diagnosed(job)
    typical = result.model.typical
    text = " ".join(TextRenderer().render(result).split())
    top = result.model.digest["top_exposed"]
    if typical is None or not top["shown"]:
        return
    excluded = {e.step: e.role for e in typical.excluded}
    shown = sorted({c["step"] for c in top["rows"] if c.get("step") in excluded})
    heading = re.search(r"Top \d+ collectives by exposed time(?P<label>[^:]*):", text)
    assert heading, job
    for step in shown:
        assert f"step {step} {excluded[step]} included, which the breakdown leaves out" in heading["label"], job
    if not shown:
        assert heading["label"] == "", job


def test_the_straggler_figures_are_the_breakdowns():
    """ddp_straggler's card gave 31.6 ms (caused, mean over the steady steps), 34.0 ms (the median
    rank not late, typical step) and the tree 29.8 ms (typical step, mean over the ranks) for the
    one waiting; DLRM's "the others wait 5.99 ms for it" was all their waiting, not the 4.40 ms
    rank 7 causes, and it named ranks 6, 2, 0 at "0.0 µs (0%)". The figure the others wait for
    the late ranks in the typical step is the tree's waiting keyed by them (mean over the ranks);
    the steady-step mean is labelled as such; no named rank is said to cause 0."""
    for job, rank, caused in (("synthetic/ddp_straggler", 5, "29.8 ms"), ("real/param_dlrm_ddp_8rank", 7, "4.40 ms")):
        result = diagnosed(job)
        finding = next(f for f in result.findings if f["rule"] == "straggler-rank")
        summary = " ".join(finding["summary"].split())
        typical = result.model.typical
        keyed = sum(v for peer, v in typical.details.wait_by_peer.items() if peer in {str(r) for r in finding["ranks"]})
        assert fmt_us(keyed) == caused
        assert f"in typical step {typical.step} the others' waiting for " in summary
        assert re.search(rf"waiting for (?:it|them) is {re.escape(caused)} \(mean over the ranks", summary), summary
        assert finding["evidence"]["caused_wait_in_step_us"] == pytest.approx(keyed, abs=0.1)
        text = " ".join(TextRenderer().render(result).split())
        assert f"for rank {rank} {caused}" in text  # the tree's figure, the same
        assert "0.0 µs (0%)" not in summary and " (0%)" not in summary
        assert "mean over the ranks and the " in summary  # the steady-step mean, labelled
    dlrm = next(f for f in diagnosed("real/param_dlrm_ddp_8rank").findings if f["rule"] == "straggler-rank")
    assert "ranks 6, 2, 0 cause none of it directly" in " ".join(dlrm["summary"].split())


def _gate_against(new_job: str, base_job: str, preset: str | None = "recommended"):
    from analyzer.compare.gate import parse_gate_config, registered_rule_names
    config = parse_gate_config({}, preset, None, registered_rule_names(), "test")
    return evaluate(diagnosed(new_job), config, diagnosed(base_job), "base.json", run_label="new/")


def test_a_share_changes_in_points_in_the_gate_and_the_diff_alike():
    """ddp_healthy_8r → ddp_straggler: the gate said exposed +17.93 pp, the diff "+1643.2%", and
    idle 0.15% → 0.11% (0.04 points) "-29.3% better". A share's change is in points of the step
    in both; under a tenth of a point it is "same"."""
    from analyzer.reports.diff_text import DiffTextRenderer
    from analyzer.reports.gate_text import render_text
    base, new = diagnosed("synthetic/ddp_healthy_8r"), diagnosed("synthetic/ddp_straggler")
    diff = diff_runs(base, new)
    metrics = {m["metric"]: m for m in diff["metrics"]}
    exposed, idle = metrics["exposed_comm_pct"], metrics["idle_pct"]
    assert exposed["delta_pp"] == pytest.approx(exposed["new"] - exposed["base"])
    assert idle["verdict"] == "same" and abs(idle["delta_pp"]) < 0.1
    assert "delta_pp" not in metrics["step_time_us"]
    checks = {c.name: c for c in _gate_against("synthetic/ddp_straggler", "synthetic/ddp_healthy_8r").checks
              if c.kind == "baseline"}
    assert checks["exposed_comm_pct"].change_pp == pytest.approx(exposed["delta_pp"])
    printed = f"+{exposed['delta_pp']:.2f} pp"
    diff_text = DiffTextRenderer().render(diff)
    gate_text = render_text(_gate_against("synthetic/ddp_straggler", "synthetic/ddp_healthy_8r"))
    for view, section in ((diff_text, "Metrics ("), (gate_text, "Baseline ")):
        row = next(line for line in view.split(section, 1)[1].splitlines() if " exposed_comm_pct " in line)
        assert printed in row, row
    for line in (line for line in diff_text.splitlines() + gate_text.splitlines() if "_pct " in line):
        assert not re.search(r"_pct\s.*\d%\s+[+-]\d[\d.]*%", line), line  # never a share's relative change


def test_mfu_is_a_percentage_in_every_view():
    """The gate printed shapes_mfu 0.4899 where diagnose says "MFU 49.0%": one convention, a
    percentage (the JSON keeps the fraction the metric is defined by)."""
    from analyzer.base.units import fmt_unit
    from analyzer.reports.gate_text import render_text
    text = render_text(_gate_against("synthetic/ddp_straggler", "synthetic/ddp_healthy_8r"))
    row = next(line for line in text.splitlines() if " shapes_mfu " in line)
    mfu = diagnosed("synthetic/ddp_straggler").model.compute.mfu
    assert fmt_unit(mfu, "fraction") in row and f"{100 * mfu:.2f}%" in row
    assert f"MFU {100 * mfu:.1f}% of the step" in " ".join(TextRenderer().render(diagnosed("synthetic/ddp_straggler")).split())


def test_a_failing_gate_fits_100_columns_says_a_shared_note_once_and_says_why():
    """Gate lines ran to 301 characters (a finding's whole summary in a cell), the same noise
    note on every row, and a failing gate did not say which findings came with the regression.
    Every line fits 100 columns; the unknown noise is said once; the failure names the findings
    that appeared or grew since the baseline and the `tracecliff diff` command to see them."""
    from analyzer.reports.gate_text import render_text
    report = _gate_against("synthetic/ddp_straggler", "synthetic/ddp_healthy_8r")
    text = render_text(report)
    assert report.failed
    words = [line for line in text.splitlines() if not line.startswith(("warning:", "  /"))]
    assert max(map(len, words)) <= 100, max(words, key=len)
    flat = " ".join(text.split())
    assert flat.count("noise unknown:") == 1
    assert "Why it failed: " in flat
    grown = report.findings_since
    assert [f["rule"] for f in grown if f["change"] == "appeared"] == ["straggler-rank"]
    assert "appeared since the baseline: straggler-rank (1 finding(s), estimated gain" in flat
    assert "see them: tracecliff diff base.json new/" in flat
    from analyzer.reports.gate_text import render_markdown
    summary = render_markdown(report)
    assert "**Why it failed: " in summary and "straggler\\-rank" in summary and "tracecliff diff" in summary
    # against itself nothing appeared or grew, and the gate passes
    same = _gate_against("synthetic/ddp_straggler", "synthetic/ddp_straggler")
    assert not same.failed and same.findings_since == []


def test_the_gate_json_says_the_shared_noise_note_once():
    """The gate's JSON repeated "noise unknown: …" in every comparison's ``bound`` (and message):
    each row keeps its own bound (the threshold and its term), the shared note is said once, in
    the top-level ``notes``; the GitHub summary says it once too."""
    import json

    from analyzer.reports.gate_text import render_markdown
    report = _gate_against("synthetic/ddp_straggler", "synthetic/ddp_healthy_8r")
    doc = json.loads(json.dumps(report.to_dict()))
    compared = [c for c in doc["checks"] if c["kind"] == "baseline" and c["threshold"]]
    assert compared and all(c["bound"].startswith("Δ ≤ ") for c in compared)
    assert json.dumps(doc).count("noise unknown") == 1 and doc["notes"][0].startswith("noise unknown: ")
    assert {c["bound"] for c in compared} >= {f"Δ ≤ {c.threshold.own}" for c in report.checks if c.threshold}
    assert " ".join(render_markdown(report).split()).count("noise unknown") == 1


def test_a_persisting_finding_that_grew_is_named():
    """A finding in both runs whose count or estimated gain grew is what a failing gate names."""
    from analyzer.compare.diff import grown_findings
    base, new = diagnosed("synthetic/ddp_straggler"), diagnosed("synthetic/ddp_straggler")
    assert grown_findings(base, new) == []
    bigger = [dict(f, estimated_gain_us=2 * f["estimated_gain_us"]) for f in new.findings]

    class Run:
        findings = bigger
    grown = grown_findings(base, Run())
    assert [(f["rule"], f["change"]) for f in grown] == [("straggler-rank", "grew")]


def test_a_bundled_sample_does_not_warn_about_its_own_truth_json(tmp_path):
    """Every bundled synthetic sample warned "skipped 1 JSON file(s) that are not traces:
    .../truth.json": the generator's file beside its traces is left out without a word; any
    other JSON file that is no trace is still named."""
    from analyzer.ingest.files import discover_trace_files
    job = "synthetic/ddp_straggler"
    assert not any("truth.json" in w for w in diagnosed(job).warnings)
    (tmp_path / "rank-0.json").write_text('{"traceEvents": []}')
    (tmp_path / "truth.json").write_text('{"step_time_us": 1}')
    (tmp_path / "config.json").write_text('{"lr": 1}')
    skipped: list = []
    assert [p.name for p in discover_trace_files([str(tmp_path)], skipped)] == ["rank-0.json"]
    assert [p.name for p in skipped] == ["config.json"]


def test_gate_without_a_configuration_does_not_speak_of_a_file(tmp_path, monkeypatch):
    """`tracecliff gate DIR` in a directory without pyproject.toml said "no [tool.tracecliff.gate]
    assertions in pyproject.toml [tool.tracecliff]": there is no such file."""
    from analyzer.base.config import config_source
    monkeypatch.chdir(tmp_path)
    assert "no pyproject.toml in the current directory" in config_source(None)
    (tmp_path / "pyproject.toml").write_text("")
    assert config_source(None) == "pyproject.toml [tool.tracecliff]"
    assert config_source("ci/perf.toml") == "ci/perf.toml"


def _cli(args, capsys):
    from analyzer.cli.main import main
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_whatif_says_speed_up_at_one_size_dedupes_its_sources_and_has_html(capsys, tmp_path):
    """ddp_bucket_oversized --bucket-mb 25 (8 → 8 GPUs) printed "scaling efficiency 1.11" for a
    change of no scale, 23 assumption lines with the profile's datasheet sentence three times,
    and had no HTML view."""
    job = sample_traces()["synthetic/ddp_bucket_oversized"]
    code, out, _ = _cli(["whatif", *job, "--bucket-mb", "25", "--workers", "1"], capsys)
    assert code == 0 and "scaling efficiency" not in out and "speed-up (same GPUs)" in out
    section = out.split("Assumptions", 1)[1].split("\nnote:", 1)[0]
    sources = re.findall(r"\((\w+: .+?)\)$", section, flags=re.M)
    assert sources and len(sources) == len(set(sources))
    assert " ".join(section.split()).count("NVIDIA H100 datasheet: NVLink 900 GB/s") == 1
    code, out, _ = _cli(["whatif", *job, "--gpus", "16", "--nodes", "4", "--workers", "1"], capsys)
    assert code == 0 and "scaling efficiency" in out
    page = tmp_path / "w.html"
    code, _, _ = _cli(["whatif", *job, "--bucket-mb", "25", "--format", "html", "-o", page, "--workers", "1"], capsys)
    html = page.read_text()
    assert code == 0 and html.startswith("<!DOCTYPE html>") and "speed-up (same GPUs)" in html
    assert html.count("NVIDIA H100 datasheet: NVLink 900 GB/s") == 1 and "<script" not in html


def test_hang_durations_are_human_and_identical_stacks_are_printed_once(capsys):
    """subgroups_skip said "causing 4,221,654 µs of waiting"; nccl_stuck printed the same five
    frames four times, once per rank: a duration in human units, a stack once with its ranks."""
    root = SAMPLES_DIR / "flight_recorder"
    code, out, _ = _cli(["hang", root / "subgroups_skip"], capsys)
    assert "4.22 s of waiting on the others" in out and not re.search(r"\d,\d{3},\d{3} µs", out)
    code, out, _ = _cli(["hang", root / "nccl" / "nccl_stuck"], capsys)
    assert out.count("at train_step (/job/train.py:88)") == 1 and "ranks 0, 1, 2, 3: last completed" in out
    code, out, _ = _cli(["hang", root / "nccl" / "nccl_stuck", "--format", "html"], capsys)
    assert re.findall(r"<h4>(.*?)</h4>", out) == ["ranks 0, 1, 2, 3"]


def test_rules_list_what_each_detects_and_timeline_step_is_not_steps(capsys):
    """`tracecliff rules` listed each rule by its passing phrase ("No rank holds the others
    back"), and diagnose had both --step (the HTML timeline's) and --steps (the steps analysed):
    the list says what each rule detects, the timeline's option is --timeline-step (--step kept,
    hidden, as its alias)."""
    from analyzer.rules.engine import all_rules
    code, out, _ = _cli(["rules"], capsys)
    flat = " ".join(out.split())
    for rule in all_rules().values():
        assert " ".join(rule.failure_title.split()) in flat
        assert rule.title not in out, rule.title
    assert max(map(len, out.splitlines())) <= 100
    code, out, _ = _cli(["diagnose", "--help"], capsys)
    assert "--timeline-step" in out and "--step " not in out and "--steps" in out


def test_the_diff_never_cuts_a_summary(capsys):
    """The diff's findings table cut each summary at 80 characters, mid-sentence: the table
    names the rule's title, and the whole summary follows, wrapped."""
    from analyzer.reports.diff_text import DiffTextRenderer
    new = diagnosed("synthetic/ddp_straggler")
    text = DiffTextRenderer().render(diff_runs(diagnosed("synthetic/ddp_healthy_8r"), new))
    finding = next(f for f in new.findings if f["rule"] == "straggler-rank")
    assert " ".join(finding["summary"].split()) in " ".join(text.split())
    assert finding["title"] in text


def _undeclared(data, where: str) -> list[str]:
    """The evidence keys that are fields (not data: a rank, a collective, an op's name) and that
    analyzer.rules.evidence_fields does not declare."""
    from analyzer.rules.evidence_fields import field
    missing = []
    for key, value in (data.items() if isinstance(data, dict) else ()):
        declared = field(key)
        if declared is None:
            missing.append(f"{where}{key}")
            continue
        if declared.columns:
            continue
        if declared.keys is not None and isinstance(value, dict):  # keyed by data: its values are records
            for inner in value.values():  # (or, with ``inner``, mappings keyed by data again)
                for record in (inner.values() if declared.inner and isinstance(inner, dict) else [inner]):
                    missing += _undeclared(record, f"{where}{key}.*.")
        elif declared.inner:
            continue
        elif isinstance(value, dict):
            missing += _undeclared(value, f"{where}{key}.")
        elif isinstance(value, list):
            for item in value:
                missing += _undeclared(item, f"{where}{key}[].")
    return missing


# The rules whose evidence has no type yet (analyzer.rules.evidence_types, the rule's ``Evidence``):
# a ratchet, the set only shrinks (a rule outside it with no type fails, and one inside it with one).
EVIDENCE_UNTYPED: set[str] = set()


def test_every_rule_outside_the_ratchet_declares_its_evidence_type():
    """Issue 40: a rule's evidence is a Struct (frozen, unknown fields forbidden), every field
    labelled in its type, every name declared alike wherever the type's records use it."""
    import msgspec

    from analyzer.rules.engine import all_rules
    from analyzer.rules.evidence_types import ENGINE_KEYS, Evidence, evidence_spec, evidence_type
    rules = all_rules()
    untyped = {name for name, rule in rules.items() if rule.Evidence is None}
    assert untyped == EVIDENCE_UNTYPED, ("typed now, remove from EVIDENCE_UNTYPED: "
                                         f"{sorted(EVIDENCE_UNTYPED - untyped)}; no type: {sorted(untyped - EVIDENCE_UNTYPED)}")
    names = [rule.Evidence.__name__ for rule in rules.values() if rule.Evidence is not None]
    assert len(names) == len(set(names))
    for name, rule in rules.items():
        if rule.Evidence is None:
            continue
        assert issubclass(rule.Evidence, Evidence) and evidence_type(name) is rule.Evidence
        config = rule.Evidence.__struct_config__
        assert config.frozen and config.forbid_unknown_fields, name
        assert not set(rule.Evidence.__struct_fields__) & (set(ENGINE_KEYS) - {"prediction"}), name
        spec = evidence_spec(rule.Evidence)
        assert all(f.label for f in spec.values()), name
        assert isinstance(msgspec.json.schema(rule.Evidence), dict)


def _typed_errors(finding) -> list[str]:
    """Why ``finding``'s evidence is not its rule's type (none: it is, or the rule has no type):
    its own keys convert into the rule's Struct, in the type's order (the JSON stays what the
    rule wrote), the engine's into FindingEvidence; a key the type does not name fails."""
    import msgspec

    from analyzer.rules.evidence_types import ENGINE_KEYS, FindingEvidence, evidence_type
    typed = evidence_type(finding["rule"])
    if typed is None:
        return []
    fields = typed.__struct_fields__
    evidence = finding.get("evidence") or {}
    own = {k: v for k, v in evidence.items() if k in fields or k not in ENGINE_KEYS}
    engine = {k: v for k, v in evidence.items() if k not in own}
    errors = []
    if list(own) != [k for k in fields if k in own]:
        errors.append(f"{finding['rule']}: keys {list(own)} not in the order of {typed.__name__}")
    for data, kind in ((own, typed), (engine, FindingEvidence)):
        plain = msgspec.json.decode(msgspec.json.encode(data, enc_hook=lambda v: v.item()))  # as saved
        try:
            msgspec.convert(plain, kind)
        except msgspec.ValidationError as exc:
            errors.append(f"{finding['rule']}: {kind.__name__}: {exc}")
    return errors


def _world_jobs():
    from conftest import WORLD_TRACES
    return sorted(str(p) for p in WORLD_TRACES.iterdir() if p.is_dir()) if WORLD_TRACES.is_dir() else []


@pytest.mark.parametrize("job", JOBS + _world_jobs())
def test_every_evidence_field_has_a_declared_label_and_unit(job):
    """The HTML evidence showed raw names ("t comm", "s star", "exposed tail us by rank step")
    with units guessed from them: every field of every finding's evidence on the sample, real
    and world jobs is declared (analyzer.rules.evidence_fields), so each view labels it and
    gives its unit from the declaration: its rule's evidence type (issue 40), FIELDS for a rule
    with none."""
    from analyzer.rules.evidence_types import evidence_type
    if job.startswith("/"):
        from analyzer.api import DiagnoseOptions, diagnose
        result = diagnose([job], DiagnoseOptions(workers=1))
    else:
        result = diagnosed(job)
    for f in result.findings:
        evidence = {k: v for k, v in (f.get("evidence") or {}).items() if k != "prediction"}
        if evidence_type(f["rule"]) is None:  # a rule with no evidence type: FIELDS declares its keys
            assert _undeclared(evidence, "") == [], (job, f["rule"])
        assert _typed_errors(f) == [], job  # a typed rule's: its type
        assert _misshapen_columns(f) == [], job


def test_the_html_evidence_is_labelled_tables_with_declared_units():
    """ddp_bucket_oversized's card: the rank/step table printed ranks and steps as µs ("0.0 µs |
    5.0 µs | 23.5 ms") without headings, and the bucket caps (MB) as µs; straggler-rank's per-step
    tables had no headings."""
    def card(job, rule):
        return next(c for c in build_view(diagnosed(job))["findings"]["cards"] if c["rule"] == rule)

    def row(c, key):
        return next(r for r in c["evidence"] if r["key"] == key)
    oversized = card("synthetic/ddp_bucket_oversized", "ddp-bucket-oversized")
    tail = row(oversized, "exposed tail per rank and step")["table"]
    assert tail["head"] == ["rank", "step", "exposed tail"]
    rank, step, us = tail["rows"][0]
    assert re.fullmatch(r"\d+", rank) and re.fullmatch(r"\d+", step) and us.endswith((" ms", " µs"))
    caps = row(oversized, "modelled tail by bucket cap")["table"]
    assert caps["head"] == ["bucket cap", "modelled tail"] and caps["rows"][0][0] == "1.00 MB"
    assert row(oversized, "communication time")["value"].endswith(" ms")
    assert row(oversized, "suggested bucket_cap_mb")["value"] == "100.00 MB"
    straggler = card("synthetic/ddp_straggler", "straggler-rank")
    by_step = row(straggler, "waiting caused per steady step")["table"]
    assert by_step["head"][0] == "step" and by_step["head"][1:] == [f"rank {r}" for r in (2, 3, 5)]
    assert by_step["rows"][0][0] == "step 5"
    for job in ("synthetic/ddp_bucket_oversized", "synthetic/ddp_straggler", "real/param_dlrm_ddp_8rank"):
        for c in build_view(diagnosed(job))["findings"]["cards"]:
            for r in c["evidence"]:
                assert "_" not in r["key"] or r["key"].startswith("suggested bucket_cap"), (job, r["key"])
                if r.get("table"):
                    assert all(r["table"]["head"][1:]), (job, r["key"], r["table"]["head"])


def test_the_evidence_is_rendered_from_its_rules_type(tmp_path):
    """Issue 40: pipeline-bubble's per rank-step rows are [rank, step, step time, compute]; the
    one global ``by_rank_step`` declaration headed them as comm-bound-step's ("communication",
    "compute window", "exposed"). Its type declares its own columns, and the card follows it, on
    a fresh diagnosis and on the saved result read back in a new process (every rule registered)."""
    import json
    import subprocess
    import sys

    from analyzer.reports import render
    result = diagnosed("synthetic/pp_gpipe_4stage")
    card = next(c for c in build_view(result)["findings"]["cards"] if c["rule"] == "pipeline-bubble")
    rows = next(r for r in card["evidence"] if r["key"] == "per rank and step")["table"]
    assert rows["head"] == ["rank", "step", "step time", "compute"] and len(rows["rows"][0]) == 4
    saved = tmp_path / "result.json"
    saved.write_text(render(result, "json"), encoding="utf-8")
    code = ("import json, sys; from analyzer import load_result; from analyzer.reports.html import build_view; "
            "c = next(c for c in build_view(load_result(sys.argv[1]))['findings']['cards'] "
            "if c['rule'] == 'pipeline-bubble'); "
            "print(json.dumps(next(r for r in c['evidence'] if r['key'] == 'per rank and step')['table']['head']))")
    out = subprocess.run([sys.executable, "-c", code, str(saved)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == rows["head"]


class _SpecInner(Evidence, frozen=True, forbid_unknown_fields=True):
    wait_us: Annotated[Us, label("waiting")]


class _TwiceDeclared(Evidence, frozen=True, forbid_unknown_fields=True):
    inner: Annotated[_SpecInner, label("inner")]
    wait_us: Annotated[Us, label("another label")]


class _Nested(Evidence, frozen=True, forbid_unknown_fields=True):
    inner: Annotated[_SpecInner, label("inner")]


def test_a_finding_of_a_rule_with_no_type_renders_from_fields():
    """A saved finding of a rule this tracecliff does not have (renamed, removed) still renders:
    the fields FIELDS declares (a link's) with their label and unit, the others as their words
    (FIELDS no longer holds the rules' fields: their types do). An evidence type's declarations
    are derived once (cached); a name declared two ways means each where it is declared."""
    from analyzer.reports.evidence import evidence_rows, rows as render_rows
    from analyzer.rules.evidence_types import evidence_spec
    rows = evidence_rows({"rule": "no-such-rule", "evidence": {"alpha_us": 1500.0, "t_comm_us": 2.5,
                                                                "prediction": {"x": 1}}})
    assert [(r["key"], r["value"]) for r in rows] == [("t comm us", "2.50"), ("α (latency)", "1.50 ms")]
    twice = evidence_spec(_TwiceDeclared)
    assert twice["wait_us"].label == "another label" and twice["inner"].record["wait_us"].label == "waiting"
    shown = {r["key"]: r for r in render_rows({"inner": {"wait_us": 2000.0}, "wait_us": 5.0}, spec=twice)}
    assert shown["another label"]["value"] == "5.0 µs" and shown["inner"]["entries"] == ["waiting: 2.00 ms"]
    assert evidence_spec(_Nested) is evidence_spec(_Nested) and evidence_spec(_Nested)["wait_us"].unit == "us"


def test_the_html_collectives_say_which_steps_they_total():
    """The collectives' totals cover every step; the time breakdown leaves the drain out: the
    section says so, naming the steps."""
    view = build_view(diagnosed("synthetic/ddp_straggler"))["collective_steps"]
    assert view["note"] == "every step of the trace, step 7 drain included (the time breakdown leaves it out)"


def _assumptions_undeclared(assumptions, where: str) -> list[str]:
    """A prediction's or a what-if's assumptions ({key: {value, origin, source}}): each key and the
    fields of a value that is a mapping (a link's α and β) declared."""
    out = []
    for key, item in (assumptions or {}).items():
        value = item.get("value") if isinstance(item, dict) and "value" in item else item
        out += _undeclared({key: value}, where)
    return out


def _misshapen_columns(finding) -> list[str]:
    """Each list-of-rows field its type heads with ``columns``: every row exactly as long as its
    headings (pipeline-bubble's four values once sat under comm-bound-step's five headings, the
    last drawn "–"; ep-alltoall's under headings in another order)."""
    from analyzer.rules.evidence_types import evidence_spec, evidence_type
    typed = evidence_type(finding["rule"])
    if typed is None:
        return []
    out: list[str] = []

    def walk(data, spec, where):
        for key, value in (data.items() if isinstance(data, dict) else ()):
            declared = spec.get(key)
            if declared is None:
                continue
            inner = {**(declared.record or {}), **{k: v for k, v in spec.items() if k not in (declared.record or {})}}
            if declared.columns and isinstance(value, list):
                out.extend(f"{finding['rule']}: {where}{key} row of {len(row)} under {len(declared.columns)} headings"
                           for row in value if isinstance(row, list) and len(row) != len(declared.columns))
            for item in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()):
                walk(item, inner, f"{where}{key}.")
            walk(value, inner, f"{where}{key}.")

    walk(finding.get("evidence") or {}, evidence_spec(typed), "")
    return out


def _every_rule_fired():
    """Each rule's own cases (tests/rule_cases: the traces it fires on, the generated job of a
    rule no sample shows): every rule fires at least once."""
    import tempfile
    from pathlib import Path

    from analyzer.api import DiagnoseOptions, diagnose
    from analyzer.synth import JobSpec, write_job
    from rule_cases_lib import load_cases
    traces = sample_traces()
    for case in load_cases().values():
        yield from (diagnosed(t) for t in case["fires_on"] if t in traces)
        if "generated" in case:
            spec = case["generated"]
            with tempfile.TemporaryDirectory() as tmp:
                out = write_job(JobSpec(name=spec["name"], **spec["spec"]), Path(tmp) / spec["name"])
                yield diagnose(sorted(str(p) for p in out.glob("rank-*.json.gz")), DiagnoseOptions(workers=1))


def test_every_field_any_rule_writes_is_declared():
    """The views render a field's label and unit from its declaration only (no guess from a key's
    name: "gradient_bytes" 0.5, a factor, printed "0 B"): every rule fired on its cases writes
    only declared evidence fields and prediction assumptions, and so do the what-if's
    assumptions and the hardware section; a new field without a declaration fails here."""
    from analyzer.base.errors import ConfigError
    from analyzer.job.result import result_to_dict
    from analyzer.rules.engine import all_rules
    from analyzer.rules.evidence_fields import field
    from analyzer.rules.evidence_types import evidence_type
    from analyzer.whatif.projection import Scenario, project
    fired, missing = set(), set()
    for result in _every_rule_fired():
        for f in result.findings:
            fired.add(f["rule"])
            missing |= set(_typed_errors(f)) | set(_misshapen_columns(f))
            evidence = dict(f.get("evidence") or {})
            prediction = evidence.pop("prediction", None) or {}
            if evidence_type(f["rule"]) is None:  # typed rules: _typed_errors
                missing |= {f"{f['rule']}: {k}" for k in _undeclared(evidence, "")}
            missing |= {f"{f['rule']}: prediction.{k}" for k in
                        _assumptions_undeclared(prediction.get("assumptions"), "")}
    assert fired == set(all_rules())
    for job in ("synthetic/ddp_comm_bound", "synthetic/fsdp1_no_wrap", "cpu_gloo/memory_ddp"):
        result = diagnosed(job)
        missing |= {f"hardware: {k}" for k in (result_to_dict(result).get("hardware") or {}) if field(k) is None}
        for scenario in (Scenario(), Scenario(gpus=16), Scenario(strategy="fsdp-full", fsdp_units=4),
                         Scenario(bucket_mb=50), Scenario(gpus=16, strong_scaling=True)):
            try:
                doc = project(result, scenario).to_dict()
            except ConfigError:  # a scenario that job does not take (--bucket-mb on FSDP)
                continue
            missing |= {f"whatif: {k}" for k in _assumptions_undeclared(doc["assumptions"], "")}
    assert sorted(missing) == []


def test_a_data_key_named_like_a_field_keeps_its_fields_unit():
    """straggler-rank's lateness against the median rank is keyed by part ("compute", "idle"...):
    its "compute" part is µs like the others, not the what-if's "compute" (text)."""
    card = next(c for c in build_view(diagnosed("synthetic/ddp_straggler"))["findings"]["cards"]
                if c["rule"] == "straggler-rank")
    causes = next(r for r in card["evidence"] if r["key"] == "cause per late rank")["table"]
    cell = causes["rows"][0][causes["head"].index("against the median rank")]
    assert re.search(r"compute: [\d.,]+ ms", cell), cell


@pytest.mark.parametrize("other", ["synthetic/ddp_straggler", "synthetic/fsdp_hybrid_2node", "gpu_h200/ddp",
                                   "cpu_gloo/memory_ddp"])
def test_the_diff_header_and_its_sentences_fit_100_columns(other):
    """The diff's header, scaling, compute and step-time lines ran to 150 columns ("Throughput
    ratio (new / base): … basis: FLOPs per GPU per step …"): every sentence of the view (a line
    that is no table row: no column gap in it) fits 100 columns, both ways round."""
    from analyzer.reports.diff_text import DiffTextRenderer
    base = diagnosed("synthetic/ddp_healthy_8r")
    for a, b in ((base, diagnosed(other)), (diagnosed(other), base)):
        text = DiffTextRenderer().render(diff_runs(a, b))
        prose = [line for line in text.splitlines() if "  " not in line.strip()]
        assert prose and max(map(len, prose)) <= 100, max(prose, key=len)
        assert text.splitlines()[1].startswith(" base ") and "Step-time change: " in text


def test_the_straggler_evidence_says_which_waiting_is_direct():
    """On the DLRM job the replay names ranks 6, 2 and 0 (each sets the pace once rank 7 is fixed)
    while their share of the waiting read 0.0 under "caused_wait_share": the evidence names the
    figure (waiting caused directly) apart from what fixing each gives (the replay's per rank)."""
    job = "real/param_dlrm_ddp_8rank"
    if job not in JOBS:
        pytest.skip("real traces not found")
    result = diagnosed(job)
    f = next(f for f in result.findings if f["rule"] == "straggler-rank")
    e = f["evidence"]
    assert "caused_wait_share" not in e and "caused_wait_us" not in e
    direct = e["caused_wait_share_direct"]
    none_direct = [r for r in f["ranks"] if direct[str(r)] == 0.0]
    assert none_direct and all(p["named"] for p in e["per_rank"] if p["rank"] in none_direct)
    card = next(c for c in build_view(result)["findings"]["cards"] if c["rule"] == "straggler-rank")
    keys = {r["key"] for r in card["evidence"]}
    assert {"share of the waiting caused directly", "waiting caused directly (mean over the steady steps)",
            "replay per rank"} <= keys


def test_the_gates_whole_trace_samples_are_the_models_rank_shares():
    """Without a step breakdown the gate's per-rank samples are each rank's share as the job
    model defines it (RankFacts: the whole-trace figure of one rank, as WholeTrace's), not a
    second formula in analyzer.compare.metrics."""
    import dataclasses

    from analyzer.job.model import WholeTrace
    result = diagnosed("synthetic/ddp_straggler")
    untyped = dataclasses.replace(result, ranks=[dataclasses.replace(r, time_breakdown=None) for r in result.ranks],
                                  attribution=None, rules=None, verdict=None, findings=[])
    model = untyped.model
    assert model.typical is None
    metrics = run_metrics(untyped)
    facts = {r.rank: r for r in model.ranks}
    for name, share in (("exposed_comm_pct", "exposed_share"), ("overlap_pct", "overlap_share")):
        samples = metrics[name].samples
        assert samples and all(s.value == 100.0 * getattr(facts[s.rank], share) for s in samples)
        assert all(getattr(facts[s.rank], share) == getattr(WholeTrace.of((facts[s.rank],)), share) for s in samples)


@pytest.mark.parametrize("job", ["synthetic/ddp_bucket_undersized", "synthetic/ddp_two_hosts_stall"])
def test_a_gain_as_a_share_of_the_step_is_the_models(job):
    """The HTML card's gain and the findings' joint gain as a percentage of the typical step are
    JobModel.step_pct's (one formula), the share of the step time the views quote."""
    result = diagnosed(job)
    model = result.model
    findings = build_view(result)["findings"]
    gains = {f["rule"]: f["estimated_gain_us"] for f in result.findings if f.get("estimated_gain_us")}
    cards = [c for c in findings["cards"] if c["rule"] in gains]
    assert cards and model.step_time_us
    for card in cards:
        assert card["gain_pct"] == model.step_pct(gains[card["rule"]])
        assert card["gain_pct"] == pytest.approx(100 * gains[card["rule"]] / model.step_time_us)
    joint = result.to_dict()["recoverable"]["joint_us"]
    assert findings["joint"]["pct"] == model.step_pct(joint) and 0 < findings["joint"]["pct"] <= 100
    assert model.step_pct(None) is None


def test_a_ranks_leaf_share_is_one_figure_in_text_and_html():
    """Each rank's leaf as a percentage of its own typical step: the text per-rank table and the
    HTML per-rank bars both print Leaves.pct (not a formula each)."""
    result = diagnosed("synthetic/ddp_straggler")
    text = TextRenderer().render(result).splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("Per rank, typical step"))
    end = text.index("", start)
    rows = {int(line.split()[0]): re.findall(r"(\d+)%", line) for line in text[start + 2:end]}
    bars = {r["rank"]: {s["key"]: s["pct"] for s in r["segments"]} for r in build_view(result)["bars"]["rows"]}
    facts = {r.rank: r.typical for r in result.model.ranks}
    keys = ("compute_only", "wait", "transfer", "other", "idle")
    assert rows and set(rows) == set(bars)
    for rank, cells in rows.items():
        leaves = facts[rank]
        values = [getattr(leaves, key) for key in ("step_time_us", "compute_only_us", "exposed_wait_us",
                                                  "exposed_transfer_us", "other_gpu_us", "idle_us")]
        assert cells == [f"{leaves.pct(v):.0f}" for v in values] and cells[0] == "100"
        assert [bars[rank][k] for k in keys] == [leaves.pct(v) for v in values[1:]]


def test_the_whole_trace_bars_are_the_models_rank_leaves():
    """Without a typical step the HTML bars split each rank's whole trace with RankFacts'
    compute-only, other-GPU and idle figures (idle: the rank's measured one, the text table's,
    not a second subtraction); the parts add up to the rank's GPU span."""
    import dataclasses

    result = diagnosed("synthetic/ddp_straggler")
    untyped = dataclasses.replace(result, ranks=[dataclasses.replace(r, time_breakdown=None) for r in result.ranks],
                                  attribution=None, rules=None, verdict=None, findings=[])
    model = untyped.model
    assert model.typical is None and model.whole_trace is not None
    bars = build_view(untyped)["bars"]
    assert bars["per"] == "whole trace (no typical step)"
    facts = {r.rank: r for r in model.ranks}
    for row in bars["rows"]:
        r = facts[row["rank"]]
        assert row["parts"] == {"compute_only": r.compute_only_us, "overlapped": r.overlap_us,
                                "exposed": r.exposed_comm_us, "other": r.other_gpu_us, "idle": r.idle_us}
        doc_rank = next(d for d in untyped.to_dict()["ranks"] if d["rank"] == r.rank)
        assert r.idle_us == doc_rank["idle_us"]  # the text per-rank table's idle column
        assert row["total"] == pytest.approx(r.span_us)
        assert all(s["pct"] == r.span_pct(s["us"]) for s in row["segments"])
    # the text table's shares of the span are the same figures (overlapped, exposed, idle)
    text = TextRenderer().render(untyped).splitlines()
    start = text.index("Per rank, whole trace (µs, % of GPU span):")
    pcts = {int(line.split()[0]): re.findall(r"(\d+)%", line) for line in text[start + 2:text.index("", start)]}
    assert set(pcts) == set(facts)
    for row in bars["rows"]:
        seg = {s["key"]: s["pct"] for s in row["segments"]}
        assert pcts[row["rank"]][3:] == [f"{seg[k]:.0f}" for k in ("overlapped", "exposed", "idle")]


# ---------------------------------------------------------------- issue 40: the views compute nothing
def test_the_joint_notes_shared_time_is_the_models():
    """The HTML joint note's time each finding shares with larger gains is the job model's
    (Claim.shared_total_us over the ``recoverable`` section's findings), not a sum in the view;
    it reads the section as written, so a saved result says the same."""
    result = diagnosed("synthetic/ddp_host_sync_stall")
    claims = result.model.joint_claims
    written = result.to_dict()["recoverable"]["findings"]
    assert [(c.rule, dict(c.shared_us)) for c in claims] == [(f["rule"], f["shared_us"]) for f in written]
    sharing = [c for c in claims if c.shared_us]
    assert sharing, "ddp_host_sync_stall: two findings claim the same lost time"
    for claim in sharing:
        assert claim.shared_total_us == pytest.approx(sum(claim.shared_us.values())) and claim.shared_total_us > 0
    notes = build_view(result)["findings"]["joint"]["shared"]
    assert notes == [f"{c.rule}: {fmt_us(c.shared_total_us)} of " + " and ".join(leaf_names(c.shared_us))
                     + " already counted" for c in sharing]


@pytest.mark.parametrize("job", ["synthetic/ddp_comm_bound", "synthetic/fsdp_hybrid_2node"])
def test_a_groups_totals_and_share_of_beta_are_the_models(job):
    """The HTML collectives: each group's time and exposed time are JobModel.group_totals (the
    digest's lines summed once; they add up to the group's rows), each line's "% of β" is its
    GroupFacts.beta_pct (β the fit's, as the groups section writes it)."""
    result = diagnosed(job)
    model = result.model
    groups = build_view(result)["collectives"]["groups"]
    fits = {str(g["name"]): g for g in result.to_dict()["groups"]}
    with_beta = 0
    for g in groups:
        assert (g["total_us"], g["exposed_us"]) == model.group_totals[g["name"]]
        rows = [c for c in result.collectives if str((c.get("group") or {}).get("name")) == g["name"]]
        assert g["total_us"] == pytest.approx(sum(c["dur_us"] for c in rows))
        assert g["exposed_us"] == pytest.approx(sum(c.get("exposed_us") or 0.0 for c in rows))
        facts = model.group(g["name"])
        beta = fits[g["name"]].get("beta_gbps") if g["name"] in fits else None
        beta = beta.get("value") if isinstance(beta, dict) else beta
        assert (facts.beta_gbps if facts else None) == beta
        for line in g["table"]:
            assert line["beta_pct"] == (facts.beta_pct(line["busbw_gbps"]) if facts else None)
            if line["beta_pct"] is not None:
                with_beta += 1
                assert line["beta_pct"] == pytest.approx(100 * line["busbw_gbps"] / beta)
    assert with_beta, job


def test_mfu_is_rendered_as_the_fraction_it_is():
    """MFU is a fraction wherever the tool writes it (analyzer.job.schema.Mfu; the shapes' MFU,
    the what-if's): the HTML card renders it as a percentage always, with no guess from the
    value (1.5, a fraction above one, is 150%, not taken for 1.5%)."""
    from analyzer.reports.html import _mfu_text
    assert _mfu_text(0.42)[0] == fmt_pct(42.0)
    assert _mfu_text(1.5)[0] == fmt_pct(150.0)
    assert _mfu_text({"mfu_mean": 0.375, "source": "s"})[0] == fmt_pct(37.5)
    assert _mfu_text({"mfu_mean": {"value": 0.375, "source": "s"}})[0] == fmt_pct(37.5)


def test_memory_cached_is_the_models_in_the_text_and_the_dataframe():
    """The text memory table's "cached" (reserved at the allocated peak less allocated) and
    memory_df's cached_at_peak_bytes are the one figure, analyzer.job.model.cached_at_peak_bytes."""
    import copy
    import dataclasses

    from analyzer.base.units import fmt_bytes
    from analyzer.job.model import cached_at_peak_bytes
    sample = diagnosed("cpu_gloo/memory_ddp")  # the CPU allocator records no reserved bytes: given here
    memory = copy.deepcopy(sample.memory)
    for m in memory["ranks"]:
        for s in m["steps"]:
            s["reserved_at_peak_bytes"] = s["peak_allocated_bytes"] + 3_000_000 * (m["rank"] + 1)
            s["peak_reserved_bytes"] = s["reserved_at_peak_bytes"] + 1_000_000
    result = dataclasses.replace(sample, memory=memory)
    step = memory["drawn_step"]
    text = TextRenderer().render(result).splitlines()
    head = next(i for i, line in enumerate(text) if line.startswith("Memory (allocator events"))
    header = next(line for line in text[head:] if " cached " in line)
    rows = {}
    for line in text[text.index(header) + 1:text.index("", head)]:
        if line.split()[0].isdigit():
            rows[int(line.split()[0])] = line
    frame = result.memory_df()
    checked = 0
    for m in memory["ranks"]:
        s = next((s for s in m["steps"] if s["step"] == step), None)
        if s is None or m["rank"] not in rows:
            continue
        cached = cached_at_peak_bytes(s)
        cell = rows[m["rank"]][header.index(" cached") - 1:header.index(" cached") + len(" cached")].strip()
        assert cell == (fmt_bytes(cached) if cached is not None else "–"), rows[m["rank"]]
        mine = frame[(frame["rank"] == m["rank"]) & (frame["step"] == step)]["cached_at_peak_bytes"].tolist()
        assert mine == [cached] and cached == 3_000_000 * (m["rank"] + 1)
        checked += 1
    assert checked == len(memory["ranks"])


def test_the_host_side_collectives_per_step_are_the_models():
    """The text view's host-side collectives per rank and step (count and bytes per kind) are
    JobModel.host_side's (the digest's counts over its windows), not a division in the view."""
    result = diagnosed("cpu_gloo/ddp")
    host = result.model.host_side
    digest = result.model.digest["host_side"]
    assert host is not None and host.per == max(digest["windows"], digest["ranks"], 1)
    assert [(k, c * host.per) for k, c, _ in host.kinds] == [(k, c) for k, c, _ in digest["kinds"]]
    text = " ".join(TextRenderer().render(result).split())
    from analyzer.base.units import fmt_bytes
    parts = ", ".join(f"{kind} {count:g} ({fmt_bytes(round(size)) if size is not None else 'size unknown'})"
                      for kind, count, size in sorted(host.kinds, key=lambda k: -k[1]))
    assert f"per {host.basis}: {parts}." in text
    assert all(size is None or size == pytest.approx(total / host.per)
               for (_, _, size), (_, _, total) in zip(host.kinds, digest["kinds"]))


def test_the_whole_trace_idle_is_the_mean_of_the_ranks_measured_idle():
    """One route to idle: WholeTrace.idle_us is the mean of the ranks' measured idle (span - busy
    in ns, RankFacts.idle_us), which the HTML headline of a job without a typical step quotes."""
    import dataclasses
    result = diagnosed("synthetic/ddp_straggler")
    untyped = dataclasses.replace(result, ranks=[dataclasses.replace(r, time_breakdown=None) for r in result.ranks],
                                  attribution=None, rules=None, verdict=None, findings=[])
    model = untyped.model
    whole = model.whole_trace
    active = [r for r in model.ranks if r.span_us > 0]
    assert whole is not None and whole.idle_us == sum(r.idle_us for r in active) / len(active)
    assert whole.idle_us == pytest.approx(whole.span_us - whole.busy_us, abs=0.01)  # the same definition
    headline = {h["label"]: h for h in build_view(untyped)["summary"]["headline"]}
    assert headline["GPU idle"]["value"] == fmt_us(whole.idle_us)
    assert headline["GPU idle"]["note"].startswith(f"{100 * whole.idle_share:.1f}% of the step")


def test_a_sourced_value_is_read_one_way():
    """The value of a ``Sourced`` record (value and source) is read by analyzer.base.numbers'
    ``sourced`` / ``sourced_figure`` alone: no view or digest keeps its own copy."""
    from pathlib import Path

    from analyzer.base.numbers import sourced, sourced_figure
    assert sourced({"value": 3, "source": "x"}) == 3 and sourced(3) == 3
    assert sourced_figure({"value": float("nan")}) is None and sourced_figure(True) is None
    root = Path(__file__).resolve().parent.parent
    copies = [str(p.relative_to(root)) for folder in ("reports", "analyzer/job") for p in (root / folder).glob("*.py")
              if 'get("value") if isinstance(' in p.read_text(encoding="utf-8")]
    assert copies == []


def test_a_record_field_is_labelled_as_its_record_declares_it():
    """activation-checkpointing-room's ``peak_bytes`` is the measured peak, and its
    ``memory.peak_bytes`` the peak after the fix: one name, two figures, each labelled where it is
    (the views read a record's own declarations first)."""
    from analyzer.reports.evidence import rows as render_rows
    from analyzer.rules.evidence_types import evidence_spec, evidence_type
    from analyzer.rules.engine import all_rules
    all_rules()
    spec = evidence_spec(evidence_type("activation-checkpointing-room"))
    assert spec["peak_bytes"].label == "measured peak"
    assert spec["memory"].record["peak_bytes"].label == "peak after the fix"
    shown = {r["key"]: r for r in render_rows({"peak_bytes": 2e9, "memory": {"fits": True, "peak_bytes": 3e9}},
                                              spec=spec)}
    assert shown["measured peak"]["value"] == "2.00 GB"
    assert "peak after the fix: 3.00 GB" in shown["memory after the fix"]["entries"]
