"""A process group's bus bandwidth (analyzer.job.busbw, models.md §2 "Bus bandwidth of a job"):
one definition, the typical step's bus bytes over their transfer time, over the collectives whose
transfer is measured (matched on every member, the wait for the last one taken out). Checked
against the generator's truth (each collective's bytes and transfer time, the link's β), with the
link halved, on windows of one run, and where it cannot be measured (send/recv, a member's trace
missing), which every view says and the gate does not gate.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import replace

import pytest

from analyzer.api import load_run
from analyzer.cli.main import main
from analyzer.compare.diff import metric_deltas
from analyzer.compare.gate import GateConfig, compare_baseline, evaluate
from analyzer.compare.metrics import run_metrics, unmeasured_metrics
from analyzer.job.busbw import group_busbw
from analyzer.job.columns import CollectiveColumns
from analyzer.job.commfit import transfer_measured
from analyzer.job.crossrank import analyze, matched_ranks
from analyzer.job.model import group_label
from analyzer.model.formulas import busbw_factor
from analyzer.synth import SCENARIOS, write_job
from analyzer.synth.parallel import PARALLEL_SCENARIOS, write_parallel_job
from conftest import SAMPLES

HEALTHY = replace(SCENARIOS["ddp_healthy_8r"], name="healthy", n_layers=2, steps=6, first_step=5, world_size=4,
                  gpus_per_node=4)
PP = SAMPLES / "synthetic" / "pp_gpipe_4stage"
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("busbw")
    halved = replace(HEALTHY, name="halved", nvlink_gbps=HEALTHY.nvlink_gbps / 2)
    return {"healthy": write_job(HEALTHY, root / "healthy"), "halved": write_job(halved, root / "halved")}


def truth(job) -> dict[str, dict[tuple[int, int], tuple[float, float]]]:
    """label -> (rank, step) -> (Σ bus bytes, Σ transfer µs) of the generator's collectives
    (its own record of each one's bytes and transfer time; the factor on its group's size)."""
    doc = json.loads((job / "truth.json").read_text())
    groups = {g["name"]: g for g in doc["groups"]}
    out: dict[str, dict[tuple[int, int], tuple[float, float]]] = {}
    columns = doc["collectives"]["columns"]
    for values in doc["collectives"]["rows"]:
        row = dict(zip(columns, values))
        group = groups[row["group"]]
        cell = out.setdefault(group["desc"] or group["name"], {}).setdefault((row["rank"], row["step"]), (0.0, 0.0))
        out[group["desc"] or group["name"]][(row["rank"], row["step"])] = (
            cell[0] + row["bytes"] * busbw_factor(row["name"], group["size"]), cell[1] + row["transfer_us"])
    return out


def gbps(cells) -> float:
    """GB/s of (bus bytes, µs) cells together."""
    return sum(b for b, _ in cells) / sum(t for _, t in cells) * 1e-3


@pytest.mark.parametrize("job", ["ddp_healthy_8r", "ddp_2node_16r_healthy", "ddp_entry_skew", "ddp_straggler",
                                 "ddp_bucket_undersized", "fsdp_hybrid_2node"])
def test_the_figure_is_the_generators_over_the_typical_step(job):
    """On jobs whose ranks arrive up to 20 ms apart (entry skew), one rank 30% slower, latency-
    bound cross-node buckets and HSDP (two labels, several groups each): the figure is the
    typical step's Σ S·factor / Σ transfer of the generator's own collectives, and each sample
    the same of one rank and steady step; the drain and warm-up steps are in neither."""
    run = load_run([str(SAMPLES / "synthetic" / job)], report=False, no_cache=True)
    typical = run.model.typical
    expected = truth(SAMPLES / "synthetic" / job)
    assert set(run.model.group_busbw) == set(expected)
    for label, cells in expected.items():
        figure = run.model.group_busbw[label]
        in_typical = [v for (_, step), v in cells.items() if step == typical.step]
        assert figure.gbps == pytest.approx(gbps(in_typical), rel=1e-9)
        assert figure.basis.startswith(f"typical step {typical.step}: Σ bus bytes / Σ transfer time")
        steady = {key: v for key, v in cells.items() if key[1] in typical.steady_steps}
        assert {(r, s): v for r, s, v in figure.samples} == pytest.approx({k: gbps([v]) for k, v in steady.items()},
                                                                          rel=1e-9)
        metric = run_metrics(run)[f"busbw_gbps:{label}"]
        assert metric.typical == figure.gbps and metric.basis == figure.basis
        entry = next(g for g in run.groups if (g["description"] or g["name"]) == label)
        assert entry["busbw_gbps"] == entry["busbw_median_gbps"] == round(figure.gbps, 3)


def test_a_collectives_busbw_is_its_transfer_rate_below_the_links_beta(jobs):
    """Every all-reduce of the healthy job has its busbw (matched on all 4 ranks), the
    generator's S·factor/transfer, never above the link's β (450 GB/s NVLink); the big buckets'
    figure within 10% of it (α and 1% contention are the rest)."""
    run = load_run([str(jobs["healthy"])], report=False, no_cache=True)
    doc = json.loads((jobs["healthy"] / "truth.json").read_text())
    rows = [dict(zip(doc["collectives"]["columns"], v)) for v in doc["collectives"]["rows"]]
    want = sorted(round(r["bytes"] * busbw_factor("allreduce", 4) / r["transfer_us"] * 1e-3, 4) for r in rows)
    got = sorted(c["busbw_gbps"] for c in run.collectives)
    assert got == pytest.approx(want, abs=2e-4) and max(got) <= HEALTHY.nvlink_gbps
    assert 0.9 * HEALTHY.nvlink_gbps < run.model.group_busbw["default_pg"].gbps < HEALTHY.nvlink_gbps


def test_the_link_halved_halves_the_figure_and_fails_the_gate(jobs, capsys):
    """The generator's NVLink at 225 GB/s: the figure follows its truth (about half), and the
    gate against the healthy run fails on it, naming the metric; windows of either run against
    windows of the same run pass on it."""
    base = load_run([str(jobs["healthy"])], report=False, no_cache=True)
    new = load_run([str(jobs["halved"])], report=False, no_cache=True)
    before, after = (r.model.group_busbw["default_pg"] for r in (base, new))
    typical = new.model.typical.step
    assert after.gbps == pytest.approx(gbps([v for (_, s), v in truth(jobs["halved"])["default_pg"].items()
                                             if s == typical]), rel=1e-9)
    assert 0.49 < after.gbps / before.gbps < 0.52
    report = evaluate(new, GateConfig(), base, "base")
    assert "busbw_gbps:default_pg" in [c.name for c in report.failed]
    with pytest.raises(SystemExit) as exited:
        main(["gate", str(jobs["halved"]), "--baseline", str(jobs["healthy"])])
    out = capsys.readouterr().out
    assert exited.value.code == 1 and next(line for line in out.splitlines()
                                           if "busbw_gbps:default_pg" in line).split()[0] == "FAIL"
    for job in ("healthy", "halved"):
        windows = [load_run([str(jobs[job])], report=False, steps=f"{a}-{a + 1}") for a in range(5, 10)]
        checks = [c for a, b in itertools.permutations(windows, 2) for c in compare_baseline(a, b, GateConfig())
                  if c.name == "busbw_gbps:default_pg"]
        assert len(checks) == 20 and {c.status for c in checks} == {"pass"}


def test_send_recv_is_not_measured_and_not_gated():
    """The pipeline's send and recv kernels: a recv posted early waits for its send (up to
    1.9 ms for a 20 µs transfer), and nothing pairs them, so no transfer time is measured: no
    collective has a busbw, the group's figure is none, and every view says why; windows of the
    run are not gated on it (the old median of sends and recvs moved 3.6 -> 0.66 GB/s)."""
    run = load_run([str(PP)], report=False, no_cache=True)
    assert all(c["busbw_gbps"] is None and c["algbw_gbps"] is None for c in run.collectives)
    figure = run.model.group_busbw["default_pg"]
    assert figure.gbps is None and "send/recv only" in figure.basis
    assert "busbw_gbps:default_pg" not in run_metrics(run)
    assert unmeasured_metrics(run) == {"busbw_gbps:default_pg": figure.basis}
    assert run.groups[0]["busbw_gbps"] is None and run.groups[0]["busbw_basis"] == figure.basis
    windows = [run] + [load_run([str(PP)], report=False, steps=steps) for steps in ("3", "4", "3-4")]
    for a, b in itertools.permutations(windows, 2):
        (check,) = [c for c in compare_baseline(a, b, GateConfig()) if c.name == "busbw_gbps:default_pg"]
        assert check.status == "skip" and check.message.startswith("not gated (neither run): bus bandwidth of group "
                                                                   "default_pg not measured: send/recv only")
    (row,) = [m for m in metric_deltas(run, windows[1]) if m["metric"] == "busbw_gbps:default_pg"]
    assert row["verdict"] == "not measured" and row["note"].startswith("both: not measured: send/recv only")


def test_the_views_label_the_figure_and_say_why_there_is_none(tmp_path, capsys):
    """Text and HTML show the gate's figure with what it is (the typical step's), or why none."""
    for job, shown in (("ddp_healthy_8r", "436.4"), ("pp_gpipe_4stage", "-")):
        path = SAMPLES / "synthetic" / job
        with pytest.raises(SystemExit):
            main(["diagnose", str(path), "--no-cache"])
        text = capsys.readouterr().out
        figure = load_run([str(path)], report=False).model.group_busbw["default_pg"]
        row = next(line for line in text.splitlines() if line.startswith("default_pg "))
        assert row.split()[-2] == shown
        assert f"busbw default_pg: {figure.basis}"[:80] in " ".join(text.split())
        with pytest.raises(SystemExit):
            main(["diagnose", str(path), "--no-cache", "--format", "html", "-o", str(tmp_path / "r.html")])
        capsys.readouterr()
        html = (tmp_path / "r.html").read_text()
        assert f"{figure.basis}." in html.replace("&#39;", "'")
        if figure.gbps is not None:
            assert f"<strong>{shown} GB/s</strong>" in html


def test_a_member_missing_from_the_new_run_fails_the_gate(jobs, tmp_path):
    """Three of the healthy job's four ranks: each all-reduce's wait for the fourth is unknown,
    so is its transfer time; the figure the baseline has is missing, and that fails, saying why."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for rank in range(3):
        shutil.copy(jobs["healthy"] / f"rank-{rank}.json.gz", partial)
    base = load_run([str(jobs["healthy"])], report=False, no_cache=True)
    new = load_run([str(partial)], report=False, no_cache=True)
    reason = ("bus bandwidth of group default_pg not measured: 3 of the group's 4 members' traces given: each "
              "collective's wait for the members not given is unknown, so its transfer time is too")
    (check,) = [c for c in compare_baseline(new, base, GateConfig()) if c.name == "busbw_gbps:default_pg"]
    assert check.status == "fail" and check.message == f"in the baseline, missing in the new run: {reason}"
    (check,) = [c for c in compare_baseline(base, new, GateConfig()) if c.name == "busbw_gbps:default_pg"]
    assert check.status == "skip" and check.message == f"not gated (the baseline): {reason}"


def test_a_saved_result_gives_the_same_figure(jobs, tmp_path):
    """The matched sets are not in the JSON: a loaded result matches its rows again, and gives
    the same figure, basis and samples."""
    saved = tmp_path / "saved.json"
    with pytest.raises(SystemExit) as exited:
        main(["diagnose", str(jobs["healthy"]), "--no-cache", "--format", "json", "-o", str(saved)])
    assert exited.value.code == 0
    assert load_run([str(saved)]).model.group_busbw == load_run([str(jobs["healthy"])]).model.group_busbw


def test_a_pipeline_link_halved_is_not_gated_on_busbw(tmp_path):
    """What the gate cannot see, said: the pipeline's transfers twice as long leave its busbw
    unmeasured in both runs (skipped, with the reason), never a pass."""
    slow = write_parallel_job(replace(PARALLEL_SCENARIOS["pp_gpipe_4stage"], comm_slowdown=2), tmp_path / "pp")
    checks = compare_baseline(load_run([str(slow)], report=False), load_run([str(PP)], report=False), GateConfig())
    (check,) = [c for c in checks if c.name == "busbw_gbps:default_pg"]
    assert check.status == "skip" and "send/recv only" in check.message


def test_the_models_md_example():
    """docs/models.md §2's worked example: fsdp2_tp_2d's mesh_dp_shard (4 ranks), per step 4
    all-gathers of 8 MiB output in 40 µs and 4 reduce-scatters of 2 MiB input in 50 µs: 87.4 GB/s
    (the median of the eight, 94.4, was the figure before)."""
    gather, scatter = (8 << 20) * busbw_factor("allgather", 4), (2 << 20) * busbw_factor("reduce_scatter", 4)
    assert gather / 40 * 1e-3 == pytest.approx(157.3, abs=0.05) and scatter / 50 * 1e-3 == pytest.approx(31.5, abs=0.05)
    by_hand = (4 * gather + 4 * scatter) / (4 * 40 + 4 * 50) * 1e-3
    assert by_hand == pytest.approx(87.38, abs=0.005)
    run = load_run([str(SAMPLES / "synthetic" / "fsdp2_tp_2d")], report=False, no_cache=True)
    figure = run.model.group_busbw["mesh_dp_shard"]
    assert figure.gbps == pytest.approx(by_hand, rel=1e-9)
    assert "(2 groups of this name)" in figure.basis


def test_which_transfers_are_measured_by_hand():
    """A collective's transfer is measured where it is matched on every member of its group:
    the all-reduces of a 3-rank group with its 3 traces (the last arrival's 100 µs), not those
    of a 4-rank group seen on 3 of them (the wait for the fourth is unknown), not a send/recv
    pair (never matched: its Seq counts one rank's own p2p calls, and a p2p kernel waits for its peer), not a CPU-side op, not a
    collective of unknown size."""
    def row(rank, start, dur, seq, kind="allreduce", size=3, on_gpu=True, nbytes=1 << 20):
        group = {"name": str(size), "ranks": list(range(size)), "size": size, "description": f"g{size}"}
        return {"rank": rank, "start_us": start, "dur_us": dur, "step": 1, "collective": kind, "group": group,
                "seq": seq, "comms_id": None, "bytes": nbytes, "on_gpu": on_gpu}
    rows = [row(r, 1000.0 + 100 * r, 400.0 - 100 * r, 1) for r in range(3)]  # rank 2 last: 200 µs
    rows += [row(r, 2000.0, 100.0, 2, size=4) for r in range(3)]  # rank 3 not given
    rows += [row(0, 3000.0, 20.0, 3, kind="send"), row(1, 2900.0, 120.0, 3, kind="recv")]
    rows += [row(r, 4000.0, 50.0, 4, on_gpu=False) for r in range(3)]
    rows += [row(r, 5000.0, 50.0, 5, nbytes=None) for r in range(3)]
    view = CollectiveColumns(rows)
    analyze(rows, 3, view)
    assert matched_ranks(view).tolist() == [3, 3, 3, 3, 3, 3, 0, 0, 3, 3, 3, 3, 3, 3]
    assert transfer_measured(view).tolist() == [True] * 3 + [False] * 11
    assert [r["wait_us"] for r in rows[:3]] == [200.0, 100.0, 0.0]  # transfer = 200 µs on each
    figures = group_busbw(view, group_label, 1, (1,))
    assert figures["g3"].gbps == pytest.approx((1 << 20) * busbw_factor("allreduce", 3) / 200.0 * 1e-3)
    assert figures["g4"].gbps is None and "3 of the group's 4 members' traces given" in figures["g4"].basis
