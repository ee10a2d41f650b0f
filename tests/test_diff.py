"""tracecliff diff: zero deltas against itself, a hand-worked slow-down, and a hand-worked
scaling cliff (2 GPUs on one node -> 4 GPUs on two nodes with a slower, cross-node all-reduce).

``ddp_job`` steps, per rank: forward compute [0,30), backward [30,70), all-reduce [60, 60+c),
optimizer [60+c, 65+c), next step at 65+c. So step time 65+c, compute 75, exposed comm c−10,
idle 0, and 75 + (c−10) = 65+c adds up. Step 2, the last, is the drain: every figure is the
typical step's, step 1, as the verdict's.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from analyzer.cli.main import main
from analyzer.compare.diff import diff_runs
from analyzer.reports.diff_html import DiffHtmlRenderer
from analyzer.reports.diff_text import DiffTextRenderer, table
from analyzer.reports.wrap import WIDTH
from builders import two_step_ddp


def load_run(paths):
    """The run (a saved result or traces) as gate and diff read it: a Result."""
    from analyzer.api import load_run as load
    return load(paths)


def ddp_job(directory, world: int, gpus_per_node: int, comm_us: float):
    directory.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        two_step_ddp(rank, comm_us=comm_us, period=65.0 + comm_us, group_ranks=range(world), world_size=world,
                     pg_ranks=range(world), host=f"node{rank // gpus_per_node}").write(directory / f"rank-{rank}.json")
    return str(directory)


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exited:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.fixture(scope="module")
def cliff(tmp_path_factory):
    root = tmp_path_factory.mktemp("cliff")
    base = load_run([ddp_job(root / "small", world=2, gpus_per_node=2, comm_us=30)])
    new = load_run([ddp_job(root / "large", world=4, gpus_per_node=2, comm_us=60)])
    return base, new


def test_a_run_against_itself_has_zero_deltas(tmp_path):
    for rank in (0, 1):
        two_step_ddp(rank=rank).write(tmp_path / f"rank-{rank}.json")
    doc = load_run([str(tmp_path)])
    diff = diff_runs(doc, doc)
    assert diff["metrics"] and all(m["delta"] == 0 and m["verdict"] == "same" for m in diff["metrics"])
    assert diff["collectives"] and all(c[k]["delta"] == 0 for c in diff["collectives"]
                                       for k in ("count", "bytes", "time_us", "exposed_us"))
    assert diff["ranks"] and all(r["delta"] == 0 for r in diff["ranks"])
    step = diff["step_time"]
    assert step["delta_us"] == 0 and all(c["delta_us"] == 0 for c in step["components"])
    assert diff["scaling"]["efficiency"] == 1.0 and diff["same_scale"]
    changes = diff["findings"]
    assert changes["appeared"] == changes["resolved"] == []
    assert all(f["count"] == f["base_count"] for f in changes["persisting"])


def test_uniform_slowdown_is_decomposed_exactly(tmp_path):
    """two_step_ddp scaled by 1.2: the typical step (step 1) 100 -> 120 µs; compute only 75 -> 90,
    exposed 20 -> 24, idle 5 -> 6; the leaves add up to the change."""
    from test_gate import write_job
    base = load_run([str(write_job(tmp_path / "a"))])
    slow = load_run([str(write_job(tmp_path / "b", factor=1.2))])
    step = diff_runs(base, slow)["step_time"]
    parts = {c["component"]: c for c in step["components"]}
    assert step["delta_us"] == pytest.approx(20.0)
    assert step["base_step_time_us"] == base.attribution["step_time_us"]  # the verdict's figure
    assert parts["compute only"]["delta_us"] == pytest.approx(15.0)
    assert parts["exposed transfer"]["delta_us"] == pytest.approx(4.0)
    assert parts["GPU idle and waiting for late peers"]["delta_us"] == pytest.approx(1.0)
    assert sum(c["delta_us"] for c in step["components"]) == pytest.approx(step["delta_us"])
    assert diff_runs(base, slow)["scaling"]["efficiency"] == pytest.approx(100 / 120)


def test_scaling_cliff_is_measured_and_attributed(cliff):
    base, new = cliff
    diff = diff_runs(base, new, "small", "large")
    assert (diff["base"]["world_size"], diff["base"]["nodes"]) == (2, 1)
    assert (diff["new"]["world_size"], diff["new"]["nodes"]) == (4, 2)
    scaling = diff["scaling"]
    assert scaling["kind"] == "weak scaling" and not diff["same_scale"]
    assert scaling["efficiency"] == pytest.approx(95 / 125)  # equal per-GPU batch assumed
    step = diff["step_time"]
    parts = {c["component"]: c for c in step["components"]}
    assert step["delta_us"] == pytest.approx(30.0)
    assert parts["compute only"]["delta_us"] == pytest.approx(0.0)
    comm = parts["exposed transfer"]
    assert comm["delta_us"] == pytest.approx(30.0) and comm["share_of_change_pct"] == pytest.approx(100.0)
    assert comm["efficiency_points"] == pytest.approx(100 * (1 - 95 / 125))
    allreduce = next(p for p in comm["parts"] if p["group"] == "default_pg")
    assert allreduce["cross_node"] is True
    assert allreduce["base_cross_node"] is False  # one node before, two after
    assert allreduce["delta_us"] == pytest.approx(30.0)
    assert comm["by_scope"] == {"cross-node": pytest.approx(30.0)}
    row = diff["collectives"][0]
    assert (row["group"], row["collective"]) == ("default_pg", "allreduce")
    assert row["count"]["delta"] == 0 and row["time_us"]["base"] == 30 and row["time_us"]["new"] == 60
    assert row["exposed_us"]["new"] == pytest.approx(50.0)
    assert [r["rank"] for r in diff["ranks"]] == [0, 1, 2, 3]
    assert diff["ranks"][2]["base_step_time_us"] is None and diff["ranks"][2]["verdict"] == "new"


def test_efficiency_from_tokens_per_step(cliff):
    base = dataclasses.replace(cliff[0], mfu={"tokens_per_step": 2 * 1000})
    new = dataclasses.replace(cliff[1], mfu={"tokens_per_step": 4 * 1200})  # 20% more tokens per GPU per step
    scaling = diff_runs(base, new)["scaling"]
    assert scaling["throughput_unit"] == "tokens/s"
    assert scaling["efficiency"] == pytest.approx(1.2 * 95 / 125)
    assert scaling["base_throughput_per_gpu"] == pytest.approx(1000 / 95e-6)


def test_findings_appeared_resolved_persisting(cliff):
    base = dataclasses.replace(cliff[0], findings=[
        {"rule": "ddp-bucket-oversized", "severity": "warning", "summary": "late"},
        {"rule": "straggler-rank", "severity": "warning", "summary": "rank 1"}])
    new = dataclasses.replace(cliff[1], findings=[
        {"rule": "straggler-rank", "severity": "error", "summary": "rank 3"},
        {"rule": "straggler-rank", "severity": "warning", "summary": "rank 2"},
        {"rule": "fsdp-fullshard-cross-node", "severity": "error", "summary": "x"}])
    changes = diff_runs(base, new)["findings"]
    assert [f["rule"] for f in changes["appeared"]] == ["fsdp-fullshard-cross-node"]
    assert [f["rule"] for f in changes["resolved"]] == ["ddp-bucket-oversized"]
    persisting = changes["persisting"][0]
    assert (persisting["rule"], persisting["base_count"], persisting["count"], persisting["severity"]) == \
        ("straggler-rank", 1, 2, "error")


def test_text_and_html_views(cliff):
    base, new = cliff
    diff = diff_runs(base, new, "small", '<script>alert("x")</script>')
    text = DiffTextRenderer().render(diff)
    assert "Weak-scaling efficiency: 76.0% (2 → 4 GPUs" in text
    assert re.search(r"default_pg \[intra→cross\]\s+20\.0\s+50\.0\s+\+30\.0\s+100\.0%", text)
    html = DiffHtmlRenderer().render(diff)
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    block = re.search(r'<script type="application/json" id="tracecliff-diff">(.*?)</script>', html, re.S)
    assert json.loads(block.group(1))["new"]["label"] == '<script>alert("x")</script>'
    assert "http://" not in html and "https://" not in html  # self-contained


def test_cli_formats_and_errors(tmp_path, capsys, cliff):
    small = ddp_job(tmp_path / "small", world=2, gpus_per_node=2, comm_us=30)
    saved = tmp_path / "small.json"
    assert run_cli(["diagnose", small, "--format", "json", "-o", saved], capsys)[0] == 0
    rc, out, _ = run_cli(["diff", saved, small, "--format", "json"], capsys)
    assert rc == 0 and json.loads(out)["step_time"]["delta_us"] == 0  # saved result vs its traces
    out_file = tmp_path / "d.html"
    assert run_cli(["diff", saved, small, "--format", "html", "-o", out_file], capsys)[0] == 0
    assert out_file.read_text().startswith("<!DOCTYPE html>")
    rc, _, err = run_cli(["diff", saved, tmp_path / "missing"], capsys)
    assert rc == 2 and "missing: no such file or directory" in err


def test_cpu_only_runs_compare_collectives_per_rank(capsys):
    """The real gloo traces have no GPU steps: collectives are compared per rank (whole trace),
    and a size the trace does not record stays unknown."""
    from conftest import SAMPLES
    ddp = load_run([str(SAMPLES / "cpu_gloo" / "ddp")])
    diff = diff_runs(ddp, ddp)
    assert diff["step_time"]["available"] is False and diff["scaling"]["efficiency"] is None
    rows = diff["collectives"]
    assert rows and {r["per"] for r in rows} == {"rank"}
    expected = sum(1 for c in ddp.collectives if c["collective"] == rows[0]["collective"]) / len(ddp.ranks)
    assert rows[0]["count"]["base"] == expected and all(r["count"]["delta"] == 0 for r in rows)
    unknown = [r for r in rows if all(c.get("bytes") is None for c in ddp.collectives
                                      if c["collective"] == r["collective"])]
    assert all(r["bytes"]["base"] is None for r in unknown)


# ---------------------------------------------------------------- predicted vs measured
@pytest.fixture(scope="module")
def bucket_fix(tmp_path_factory):
    """A generated before/after pair: DDP with 1 GiB buckets, then the same job with the
    bucket_cap_mb the finding suggests (the generator's own simulation of the fix)."""
    from dataclasses import replace
    from analyzer.synth import SCENARIOS, write_job
    from conftest import SAMPLES
    before = load_run([str(SAMPLES / "synthetic" / "ddp_bucket_oversized")])
    finding = next(f for f in before.findings if f["rule"] == "ddp-bucket-oversized")
    cap = finding["evidence"]["suggested_bucket_cap_mb"]
    folder = write_job(replace(SCENARIOS["ddp_bucket_oversized"], bucket_cap_mb=cap, first_bucket_mb=cap),
                       tmp_path_factory.mktemp("fixed") / "ddp_bucket_fixed")
    return before, load_run([str(folder)]), str(folder)


def test_diff_puts_each_prediction_beside_the_change_measured(bucket_fix):
    before, after, _ = bucket_fix
    section = diff_runs(before, after)["predictions"]
    assert section["available"] and section["same_scale"]
    assert section["measured_gain_us"] == pytest.approx(before.model.step_time_us - after.model.step_time_us)
    check = next(p for p in section["findings"] if p["rule"] == "ddp-bucket-oversized")
    finding = next(f for f in before.findings if f["rule"] == "ddp-bucket-oversized")
    assert check["status"] == "resolved"  # the fix made the rule quiet
    assert check["predicted_gain_us"] == finding["estimated_gain_us"]
    assert check["predicted_step_time_us"] == finding["evidence"]["prediction"]["predicted_step_time_us"]
    assert check["measured_step_time_us"] == after.model.step_time_us
    assert check["error_pct"] == pytest.approx(100 * (check["predicted_step_time_us"] - after.model.step_time_us)
                                               / after.model.step_time_us)
    assert abs(check["error_pct"]) < 10  # the model's audit on this pair
    assert check["whatif"].startswith("tracecliff whatif TRACES --bucket-mb")
    # the leaves it said its fix gives back, measured: the exposed transfer and waiting shrank
    leaves = check["recovered_leaves"]
    assert set(leaves) == set(finding["recovers"])
    assert check["measured_recovered_us"] == pytest.approx(sum(
        getattr(before.model.typical.leaves, leaf) - getattr(after.model.typical.leaves, leaf) for leaf in leaves))


def test_predicted_vs_measured_in_text_json_and_html(bucket_fix, capsys):
    before, after, folder = bucket_fix
    from conftest import SAMPLES
    base = str(SAMPLES / "synthetic" / "ddp_bucket_oversized")
    rc, out, _ = run_cli(["diff", base, folder], capsys)
    assert rc == 0
    assert re.search(r"Predicted vs measured (?:.*\n){2,3} ddp-bucket-oversized\s+resolved\s+[\d,.]+\s+[\d,.]+\s+[\d,.]+"
                     r"\s+[\d,.]+\s+[-+]\d+\.\d%\n\s+what-if: tracecliff whatif TRACES --bucket-mb", out)
    assert max(len(line) for line in out.splitlines()) <= WIDTH  # the predictions table fits the page
    rc, out, _ = run_cli(["diff", base, folder, "--format", "json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["predictions"]["findings"][0]["rule"] == "ddp-bucket-oversized"
    assert doc["schema_version"] == 2
    rc, out, _ = run_cli(["diff", base, folder, "--format", "html"], capsys)
    section = re.search(r'<section id="predictions">(.*?)</section>', out, re.S).group(1)
    assert "<code>ddp-bucket-oversized</code>" in section and "resolved" in section and "--bucket-mb" in section


def test_a_result_without_predictions_checks_the_gain(cliff):
    """Saved results written before predictions: the predicted step is the typical step less the gain."""
    base = dataclasses.replace(cliff[0], findings=[
        {"rule": "comm-bound-step", "severity": "warning", "title": "t", "summary": "s",
         "estimated_gain_us": 10.0, "recovers": {"exposed_transfer_us": 10.0}, "evidence": {}}])
    new = cliff[1]
    check = diff_runs(base, new)["predictions"]["findings"][0]
    assert check["predicted_step_time_us"] == pytest.approx(base.model.step_time_us - 10.0)
    assert check["whatif"] is None and check["error_pct"] is not None


def test_a_table_wider_than_the_page_wraps_its_last_column():
    """The diff's findings and predictions tables fit 100 columns: the last column (a title, a
    what-if command) wraps at words in place, or goes below its row when too little is left."""
    title = "Late ranks make the others wait at the collectives, " * 3
    rows = [["persisting", "fsdp-fullshard-cross-node", "warning", "2→3", title.strip()]]
    lines = table(["status", "rule", "severity", "count", "title"], rows, WIDTH)
    assert max(map(len, lines)) <= WIDTH and len(lines) > 2
    lead = lines[1].index("Late")
    assert all(line[:lead].strip() == "" for line in lines[2:])  # continued under its column
    assert " ".join(line[lead:] for line in lines[1:]) == title.strip()  # every word, in order
    narrow = table(["a" * 40, "b" * 40, "what-if"], [["x", "y", "tracecliff whatif TRACES --fix-ranks 5"]], WIDTH)
    assert narrow[-1] == "   what-if: tracecliff whatif TRACES --fix-ranks 5" and max(map(len, narrow)) <= WIDTH
    assert table(["a", "b"], [["1", "2"]], WIDTH) == table(["a", "b"], [["1", "2"]])  # a narrow one as it was
