"""One figure, one value: on every sample and real job, the verdict, the text headline, the HTML
headline, the attribution section, every finding's evidence, the gate's metrics and the diff
quote the same typical-step figures (the job model's); any other step time a view prints is
labelled as what it is; the findings together never recover more lost time than the typical
step loses (exposed communication + idle)."""

from __future__ import annotations

import re

import pytest

from analyzer.base.units import fmt_us
from analyzer.compare.diff import diff_runs
from analyzer.compare.gate import GateConfig, evaluate, parse_assertion
from analyzer.compare.metrics import run_metrics
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
    # every finding's evidence
    for finding in result.findings:
        if "step_time_us" in (finding.get("evidence") or {}):
            assert finding["evidence"]["step_time_us"] == pytest.approx(step, abs=0.05), finding["rule"]
    # the gate: the default aggregate is the verdict's figure, and a check reports it as such
    metrics = run_metrics(result)
    assert metrics["step_time_us"].typical == step
    assert metrics["exposed_comm_pct"].typical == pytest.approx(exposed_pct)
    assert metrics["idle_pct"].typical == pytest.approx(idle_pct)
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
