"""Scaling what-if, validated against the generator's own simulation of the target configuration
(analyzer.synth.simulate): the projection only sees the measured trace, the generator runs the
target job from scratch."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.api import DiagnoseOptions, diagnose
from analyzer.cli.main import main
from analyzer.base.errors import ConfigError
from analyzer.synth import SCENARIOS, simulate, write_job
from analyzer.job.ddp import interpolate_ready
from analyzer.whatif.projection import (Durations, Measured, Scenario, _DdpBatch, _ddp_step, _Transfers,
                                        measured_config, project, target_config)

SMALL = {"n_layers": 2, "steps": 2}


def measured(tmp_path_factory, name, **changes):
    spec = dataclasses.replace(SCENARIOS[name], **SMALL, **changes)
    folder = write_job(spec, tmp_path_factory.mktemp(name))
    files = sorted(str(p) for p in folder.glob("rank-*.json.gz"))
    truth = json.loads((folder / "truth.json").read_text())
    return spec, files, diagnose(files, DiagnoseOptions(workers=2)), truth["step_time_us"]


@pytest.fixture(scope="module")
def ddp_two_nodes(tmp_path_factory):  # 16 H100s on 2 nodes, 8 NICs per node
    return measured(tmp_path_factory, "ddp_2node_16r_healthy")


@pytest.fixture(scope="module")
def ddp_one_nic(tmp_path_factory):  # 2 nodes x 4 GPUs sharing 1 NIC per node
    return measured(tmp_path_factory, "ddp_comm_bound")


@pytest.fixture(scope="module")
def fsdp_two_nodes(tmp_path_factory):  # FSDP2 FULL_SHARD on 2 nodes x 8, 4 NICs per node
    return measured(tmp_path_factory, "fsdp_fullshard_2node")


def target_step_us(spec, **changes):
    return simulate(dataclasses.replace(spec, **changes)).step_time_us


@pytest.mark.parametrize("job", ["ddp_two_nodes", "ddp_one_nic", "fsdp_two_nodes"])
def test_own_configuration_reproduces_the_measured_step(job, request):
    spec, _, result, truth_us = request.getfixturevalue(job)
    projection = project(result)
    assert projection.projected["step_time_us"] == pytest.approx(projection.measured["step_time_us"], rel=0.05)
    assert projection.measured["step_time_us"] == pytest.approx(truth_us, rel=0.02)
    assert projection.projected["gpus"] == spec.world_size


def test_ddp_16_to_64_gpus_matches_the_generator(ddp_two_nodes):
    spec, _, result, _ = ddp_two_nodes
    projection = project(result, Scenario(gpus=64))
    assert projection.assumptions["nodes"]["value"] == 8
    truth = target_step_us(spec, world_size=64)
    assert projection.projected["step_time_us"] == pytest.approx(truth, rel=0.10)
    assert projection.projected["exposed_comm_us"] > projection.measured["exposed_comm_us"]
    assert projection.projected["scaling_efficiency"] < 1


def test_one_nic_to_four_nics_per_node_matches_the_generator(ddp_one_nic):
    spec, _, result, _ = ddp_one_nic
    projection = project(result, Scenario(nics_per_node=4))
    # The trace does not say how many NICs it had: inferred from the fitted cross-node busbw.
    assert projection.assumptions["measured_nics_per_node"]["value"] == 1
    assert projection.assumptions["measured_nics_per_node"]["origin"] == "measured"
    truth = target_step_us(spec, nics_per_node=4)
    assert projection.projected["step_time_us"] == pytest.approx(truth, rel=0.10)
    assert projection.projected["step_time_us"] < 0.85 * projection.measured["step_time_us"]


def test_ddp_bucket_cap_matches_the_generator(ddp_one_nic):
    spec, _, result, _ = ddp_one_nic
    projection = project(result, Scenario(bucket_mb=100))
    assert projection.projected["step_time_us"] == pytest.approx(target_step_us(spec, bucket_cap_mb=100.0), rel=0.10)


def test_full_shard_to_hybrid_shard_matches_the_generator(fsdp_two_nodes):
    spec, _, result, _ = fsdp_two_nodes
    projection = project(result, Scenario(strategy="hsdp"))
    truth = target_step_us(spec, sharding="hybrid_shard")
    assert projection.projected["step_time_us"] == pytest.approx(truth, rel=0.10)
    assert projection.projected["step_time_us"] < 0.9 * projection.measured["step_time_us"]


def test_fsdp_more_nodes_matches_the_generator(fsdp_two_nodes):
    spec, _, result, _ = fsdp_two_nodes
    projection = project(result, Scenario(gpus=32))
    assert projection.projected["step_time_us"] == pytest.approx(target_step_us(spec, world_size=32), rel=0.10)


def test_fsdp_to_ddp_matches_the_generator(tmp_path_factory):
    spec, _, result, _ = measured(tmp_path_factory, "fsdp1_per_layer_healthy")
    projection = project(result, Scenario(strategy="ddp"))
    assert projection.projected["step_time_us"] == pytest.approx(target_step_us(spec, strategy="ddp"), rel=0.10)
    # DDP's optimizer updates every parameter: 8x the sharded optimizer's compute
    assert projection.projected["compute_us"] > projection.measured["compute_us"]


def test_ddp_to_hybrid_shard_matches_the_generator(ddp_two_nodes):
    spec, _, result, _ = ddp_two_nodes
    projection = project(result, Scenario(strategy="hsdp"))
    truth = target_step_us(spec, strategy="fsdp1", sharding="hybrid_shard")
    assert projection.projected["step_time_us"] == pytest.approx(truth, rel=0.10)
    assert any("each gradient bucket taken as one FSDP unit" in note for note in projection.notes)


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_fsdp_units_match_a_per_block_wrap_in_the_generator(tmp_path_factory, strategy):
    """One unit (no wrap policy) -> one unit per block: the projected change, applied to the
    measured step, within 10% of the generator's per-block job."""
    spec, files, result, _ = measured(tmp_path_factory, f"{strategy}_no_wrap")  # 2 blocks
    base = project(result).projected["step_time_us"]
    fixed = project(result, Scenario(fsdp_units=2, strategy="fsdp-full"))
    predicted = result.model.step_time_us + fixed.projected["step_time_us"] - base
    truth = target_step_us(spec, fsdp_wrap="per_layer")
    assert predicted == pytest.approx(truth, rel=0.10)
    assert predicted < 0.97 * result.model.step_time_us  # the all-gathers now overlap compute
    assert fixed.assumptions["fsdp_units"]["value"] == 2
    assert any("2 units of equal size" in note for note in fixed.notes)


def test_fsdp_units_on_the_command_line(tmp_path_factory, capsys):
    _, files, result, _ = measured(tmp_path_factory, "fsdp1_no_wrap")
    with pytest.raises(SystemExit) as code:
        main(["whatif", *files, "--fsdp-units", "2", "--strategy", "fsdp-full", "--format", "json"])
    assert code.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["projected"]["model_step_time_us"] == pytest.approx(
        project(result, Scenario(fsdp_units=2, strategy="fsdp-full")).projected["step_time_us"], abs=0.01)
    # the step on the report's scale: the typical step + the change against the model as measured
    change = doc["projected"]["model_step_time_us"] - project(result).projected["step_time_us"]
    assert doc["measured"]["step_time_us"] == round(result.model.step_time_us, 1)
    assert doc["projected"]["step_time_us"] == pytest.approx(result.model.step_time_us + change, abs=0.06)
    with pytest.raises(SystemExit) as code:
        main(["whatif", *files, "--fsdp-units", "2", "--strategy", "ddp"])
    assert code.value.code == 2 and "--fsdp-units applies to FSDP" in capsys.readouterr().err


def test_fsdp_units_beyond_any_wrap_policy_are_refused(tmp_path_factory, capsys):
    """The projection replays every unit: its cost follows the count (10**5 units took minutes,
    10**9 would exhaust memory), so the count is bounded like the other counts (issue 30)."""
    from analyzer.base.errors import ConfigError
    from analyzer.base.limits import MAX_FSDP_UNITS
    _, files, result, _ = measured(tmp_path_factory, "fsdp1_no_wrap")
    with pytest.raises(SystemExit) as code:
        main(["whatif", *files, "--fsdp-units", str(MAX_FSDP_UNITS + 1), "--strategy", "fsdp-full"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and "--fsdp-units" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ConfigError, match="--fsdp-units must be 1 to 4,096"):
        project(result, Scenario(fsdp_units=10**9, strategy="fsdp-full"))
    assert project(result, Scenario(fsdp_units=MAX_FSDP_UNITS, strategy="fsdp-full")).projected["step_time_us"] > 0


def test_ddp_buckets_regrouped_into_units():
    """Buckets in launch order [head 4, 3, 3, 2, 2, 2] into 3 units of the 12 bytes after the head
    (shares end at 4, 8, 12): 3 (closer to 4 than 6 is), 3+2 (reaches 8), 2+2 and the head 4, each
    ready with its last bucket; the head reduced with the root, last."""
    from analyzer.whatif.projection import _regroup
    sizes, ready = _regroup([4.0, 3.0, 3.0, 2.0, 2.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3)
    assert sizes == [3.0, 5.0, 8.0] and ready == [2.0, 4.0, 6.0]
    assert _regroup([5.0], [1.0], 4) == ([5.0], [1.0])


def test_unsupported_projections_are_config_errors(ddp_two_nodes, fsdp_two_nodes):
    with pytest.raises(ConfigError, match="DDP only"):
        project(fsdp_two_nodes[2], Scenario(bucket_mb=50))
    with pytest.raises(ConfigError, match="whole nodes"):
        project(ddp_two_nodes[2], Scenario(gpus=12))


def test_mfu_with_model_size(ddp_two_nodes):
    spec, _, result, _ = ddp_two_nodes
    tokens = spec.world_size * spec.micro_batch * spec.seq_len
    projection = project(result, Scenario(gpus=64, model_params=1.5e9, tokens_per_step=tokens))
    m, p = projection.measured, projection.projected
    expected = tokens / (m["step_time_us"] * 1e-6) * 6 * 1.5e9 / (16 * 989e12)
    assert m["mfu"] == pytest.approx(expected, rel=1e-4)
    # weak scaling: 4x the tokens on 4x the GPUs, so MFU falls exactly as the step time grows
    assert p["mfu"] == pytest.approx(m["mfu"] * m["step_time_us"] / p["step_time_us"], rel=1e-4)


def test_cli_json_and_text(ddp_one_nic, capsys):
    _, files, _, _ = ddp_one_nic
    with pytest.raises(SystemExit) as code:
        main(["whatif", *files, "--target-nics-per-node", "4", "--format", "json"])
    assert code.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"measured", "projected", "assumptions", "notes", "warnings"}
    assert {"step_time_us", "exposed_comm_us", "compute_us"} <= set(doc["projected"])
    assert doc["assumptions"]["nics_per_node"] == {"origin": "user", "source": "what-if option", "value": 4}
    with pytest.raises(SystemExit):
        main(["whatif", *files])
    text = capsys.readouterr().out
    assert "Assumptions" in text and "step time" in text
    with pytest.raises(SystemExit) as code:
        main(["whatif", *files, "--gpus", "6"])
    assert code.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tracecliff: --gpus 6 does not fill whole nodes") and err.count("\n") == 1


def test_real_traces_project_onto_themselves(real_traces):
    for folder in ("hta_ddp_rank0_of_2", "hta_ddp_sampled_128rank", "param_dlrm_ddp_8rank"):
        result = diagnose([str(real_traces / folder)], DiagnoseOptions(workers=1))
        projection = project(result)
        assert projection.projected["step_time_us"] == pytest.approx(projection.measured["step_time_us"], rel=0.05)


# ---------------------------------------------------------------- shared measurements (speed)
SCENARIOS_OF = {
    "ddp_two_nodes": [Scenario(), Scenario(gpus=8), Scenario(gpus=64), Scenario(bucket_mb=100),
                      Scenario(gpus=64, bucket_mb=100), Scenario(strategy="hsdp"), Scenario(strategy="fsdp-full")],
    "ddp_one_nic": [Scenario(), Scenario(gpus=16), Scenario(bucket_mb=4), Scenario(nics_per_node=4)],
    "fsdp_two_nodes": [Scenario(), Scenario(gpus=64), Scenario(strategy="hsdp"), Scenario(strategy="ddp"),
                       Scenario(strategy="ddp", bucket_mb=50), Scenario(strategy="fsdp-grad-op")],
}


@pytest.mark.parametrize("job", list(SCENARIOS_OF))
def test_projections_sharing_one_measured_equal_fresh_ones(job, request):
    """The schedules a Measured memoises (and its re-bucketings per cap) do not depend on the
    scenario: projecting with one shared Measured, in any order, gives what a fresh one gives."""
    _, _, result, _ = request.getfixturevalue(job)
    shared = Measured(result)
    for scenario in SCENARIOS_OF[job] + SCENARIOS_OF[job][::-1]:
        assert project(result, scenario, shared).to_dict() == project(result, scenario).to_dict()


@pytest.mark.parametrize("job", ["ddp_two_nodes", "ddp_one_nic"])
@pytest.mark.parametrize("gpus", [4, 16, 64])
def test_ddp_steps_at_once_equal_one_step_at_a_time(job, gpus, request):
    """The scaling curve's path (every rank-step's all-reduces and pipeline at once) gives each
    step's ``_ddp_step`` bit for bit, and counts the collectives kept as measured the same way."""
    _, _, result, _ = request.getfixturevalue(job)
    scenario = Scenario(gpus=gpus)
    base, assumptions = measured_config(result, scenario, [])
    target = target_config(base, scenario, assumptions)
    shared, one_by_one = Durations(result, base, target), Durations(result, base, target)
    steps = Measured(result).steps
    rows = [dict(r, group={"name": "unknown group"}) if k % 5 == 2 else r  # some rows the model cannot scale
            for k, r in enumerate(steps[0].ddp.buckets)]
    steps[0].ddp.__dict__.update(buckets=rows)  # a frozen dataclass; this Measured is the test's own
    batch = _DdpBatch.of([s.ddp for s in steps])
    assert batch.changes(shared) == [_ddp_step(s, one_by_one, scenario) for s in steps]
    assert shared.kept == one_by_one.kept > 0


def test_a_measured_belongs_to_its_result(ddp_two_nodes, ddp_one_nic):
    with pytest.raises(ValueError, match="another result"):
        project(ddp_two_nodes[2], Scenario(), Measured(ddp_one_nic[2]))


@pytest.mark.parametrize("job", ["ddp_two_nodes", "fsdp_two_nodes"])
@pytest.mark.parametrize("gpus", [8, 16, 64])
def test_durations_of_rows_is_of_per_row(job, gpus, request):
    """The array path (one ratio per distinct key) gives each row's ``of`` bit for bit, and
    counts the rows that keep their measured duration the same way."""
    _, _, result, _ = request.getfixturevalue(job)
    notes: list[str] = []
    base, assumptions = measured_config(result, Scenario(gpus=gpus), notes)
    target = target_config(base, Scenario(gpus=gpus), assumptions)
    rows = [dict(r, group={"name": "unknown group"}) if k % 7 == 3 else r  # some rows the model cannot scale
            for k, r in enumerate(result.collectives)]
    per_row, columns = Durations(result, base, target), Durations(result, base, target)
    expected = [per_row.of(r) for r in rows]
    assert columns.of_rows(_Transfers.of(rows)).tolist() == expected
    assert columns.kept == per_row.kept > 0


def _interpolate_ready_per_item(known, weights, upper, end_value):
    """interpolate_ready as it was, one np.interp call per unknown item: the reference."""
    cum = np.cumsum([0.0] + list(weights))[1:]
    anchors = [(c, k) for c, k in zip(cum, known) if k is not None]
    if end_value is not None and (not anchors or cum[-1] > anchors[-1][0]):
        anchors.append((float(cum[-1]), end_value))
    xs, ys = [x for x, _ in anchors], [y for _, y in anchors]
    out: list[float] = []
    for c, k, cap in zip(cum, known, upper):
        value = min(k if k is not None else (float(np.interp(c, xs, ys)) if xs else cap), cap)
        out.append(max(value, out[-1]) if out else value)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(-1e6, 1e6)), st.floats(0, 1e9), st.floats(-1e6, 1e6)),
                min_size=1, max_size=40),
       st.one_of(st.none(), st.floats(-1e6, 1e6)))
def test_interpolate_ready_in_one_call_equals_one_call_per_item(items, end_value):
    known, weights, upper = (list(column) for column in zip(*items))
    same_bits = [repr(v) for v in interpolate_ready(known, weights, upper, end_value)]  # -0.0 too
    assert same_bits == [repr(v) for v in _interpolate_ready_per_item(known, weights, upper, end_value)]


def _bucket_ready_per_item(starts, ends, sizes, launches, backward_end):
    """bucket_ready_times as it was, a Python loop per bucket: the reference."""
    known = [s if k == 0 or s > ends[k - 1] + 2.0 else None for k, s in enumerate(starts)]
    ready = _interpolate_ready_per_item(known, sizes, list(starts), min(backward_end, starts[-1]))
    return [value if launch is None else min(max(value, launch), start)
            for value, launch, start in zip(ready, launches, starts)]


TIMES = st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, -0.0, 2.0, float("nan")]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(TIMES, st.floats(0, 1e4), st.floats(0, 1e9), st.one_of(st.none(), TIMES)),
                min_size=1, max_size=30), TIMES)
def test_bucket_ready_on_arrays_equals_the_loop(buckets, backward_end):
    """The array form gives the loop's ready times bit for bit (signed zeros and NaN included)."""
    starts, durations, sizes, launches = (list(column) for column in zip(*buckets))
    ends = [s + d for s, d in zip(starts, durations)]
    from analyzer.job.ddp import bucket_ready_times
    got = bucket_ready_times(starts, ends, sizes, launches, backward_end)
    assert [repr(v) for v in got] == [repr(v) for v in _bucket_ready_per_item(starts, ends, sizes, launches,
                                                                             backward_end)]


def test_bucket_ready_never_before_its_cpu_launch():
    """Back-to-back all-reduces: only the first start is a ready time, the rest are interpolated
    in bytes up to the end of backward. A bucket whose all-reduce the CPU launched later than
    that interpolation was not ready before its launch; never later than its own start."""
    from analyzer.job.ddp import bucket_ready_times
    starts, ends, sizes = [0.0, 200.0, 400.0], [200.0, 400.0, 600.0], [1.0, 1.0, 1.0]
    no_launch = bucket_ready_times(starts, ends, sizes, [None, None, None], backward_end=330.0)
    assert no_launch == [0.0, 165.0, 330.0]
    ready = bucket_ready_times(starts, ends, sizes, [None, 180.0, 390.0], backward_end=330.0)
    assert ready == [0.0, 180.0, 390.0]
    # A host clock ahead of the GPU's: the launch after the start is bounded by the start.
    assert bucket_ready_times(starts, ends, sizes, [None, 250.0, None], backward_end=330.0)[1] == 200.0


EXPOSED_ROWS = st.lists(st.fixed_dictionaries({
    "start_us": st.floats(-1e6, 1e6), "dur_us": st.floats(0, 1e4),
    "exposed_us": st.one_of(st.none(), st.floats(0, 1e4), st.just(0.0))}), max_size=12)


@settings(max_examples=300, deadline=None)
@given(EXPOSED_ROWS, st.lists(st.one_of(st.floats(-2e6, 2e6), st.sampled_from([0.0, -0.0, 0.0005, 1e300])),
                              max_size=20))
def test_progress_of_many_points_is_each_point(rows, times):
    """Compute-progress time of many points at once (prefix sums over the exposed intervals)
    is, bit for bit, the one-point form (a clipped pass over every interval) of each point."""
    from analyzer.whatif.projection import _Progress
    progress = _Progress(rows)
    try:
        expected = [repr(progress(t)) for t in times]
    except OverflowError:  # a point beyond any clock: the one-point form refuses it, and so do many
        with pytest.raises(OverflowError):
            progress.many(times)
        return
    assert [repr(v) for v in progress.many(times)] == expected


@pytest.mark.parametrize("job", ["ddp_two_nodes", "fsdp_two_nodes"])
def test_rank_steps_grouped_by_column_equal_row_by_row(job, request):
    """Each rank-step's rows (in their order) and its backward all-reduces on the GPU (in start
    order) as grouping the rows one by one gives them."""
    _, _, result, _ = request.getfixturevalue(job)
    rows_by: dict = {}
    for row in result.collectives:
        rows_by.setdefault((row["rank"], row["step"]), []).append(row)
    steps = Measured(result).steps
    expected = [rows_by.get((rank.rank, step["step"]), []) for rank in result.ranks for step in rank.steps]
    assert [len(s.rows) for s in steps] == [len(rows) for rows in expected]  # counted before they are made
    assert [list(s.rows) for s in steps] == expected  # the rows' dicts (made from the rows' table), in order
    reductions = [sorted([r for r in rows if r["collective"] == "allreduce" and r["phase"] == "backward"
                          and r.get("on_gpu")], key=lambda r: (r["start_us"], r["rank"])) for rows in expected]
    assert [list(s.backward_allreduces) for s in steps] == reductions
    # each step's waits summed by column, bit for bit as the rows one by one (from 0, in row order)
    assert [s.waits for s in steps] == [sum([r.get("wait_us") or 0.0 for r in rows]) for rows in expected]
    assert any(s.waits for s in steps)


@pytest.mark.parametrize("job", ["ddp_two_nodes", "ddp_one_nic"])
@pytest.mark.parametrize("gpus", [4, 16, 64])
def test_ddp_schedules_by_column_equal_by_row(job, gpus, request):
    """The schedules read from the Result's columns, and the batch's transfers keyed by column,
    give what the rows give: the same ready times, and the same projected steps and kept count."""
    from analyzer.whatif.projection import _ddp_schedule
    _, _, result, _ = request.getfixturevalue(job)
    scenario = Scenario(gpus=gpus)
    base, assumptions = measured_config(result, scenario, [])
    target = target_config(base, scenario, assumptions)
    steps = Measured(result).steps
    by_row = [_ddp_schedule(s.backward_allreduces, s.step, s.origin_ns) for s in steps]
    by_column = [s.ddp for s in steps]
    assert [(d.sizes, d.ready, d.backward_end, d.measured_tail) for d in by_column if d] == \
        [(d.sizes, d.ready, d.backward_end, d.measured_tail) for d in by_row if d]
    columns, rows = Durations(result, base, target), Durations(result, base, target)
    from analyzer.job.columns import CollectiveColumns
    assert _DdpBatch.of(by_column, CollectiveColumns.of(result)).changes(columns) == _DdpBatch.of(by_row).changes(rows)
    assert columns.kept == rows.kept


def _fsdp_step_built_per_projection(measured, durations, base, target):
    """_fsdp_step as it was: items made and their need points found at every projection, each
    duration by ``Durations.of`` row by row, the replay mutating the items: the reference."""
    from analyzer.whatif.projection import _Item, _need_points
    fsdp = measured.fsdp
    if fsdp is None:
        return None
    comm, issue, depends, p_backward = fsdp.comm, fsdp.issue, fsdp.depends, fsdp.p_backward
    items, item_of = [], {}
    for k, r in enumerate(comm):
        role = durations.role(r)
        if target.strategy == "fsdp-grad-op" and base.strategy != "fsdp-grad-op" \
                and r["collective"] == "allgather" and r["phase"] == "backward":
            continue
        if target.strategy != "hsdp" and role == "replicate":
            continue
        item_of[k] = len(items)
        items.append(_Item(r, r["collective"], r["stream"], issue[k], 0.0, durations.of(r, role),
                           depends=item_of.get(depends[k]) if depends[k] is not None else None,
                           measured_end=fsdp.ends[k]))
        if (target.strategy == "hsdp" and base.strategy != "hsdp" and r["collective"] == "reduce_scatter"
                and r.get("bytes")):
            shard = r["bytes"] / min(target.gpus, target.gpus_per_node)
            items.append(_Item(None, "allreduce", "replicate", issue[k], p_backward,
                               durations.new("allreduce", shard, "replicate"), depends=len(items) - 1, final=True))
    _need_points(items, p_backward, fsdp.p_forward)
    events = sorted([(item.issue, 1, i) for i, item in enumerate(items)]
                    + [(item.need, 2 if item.final else 0, i) for i, item in enumerate(items)])
    stall, stream_free, issued, previous, last_on, end = 0.0, {}, set(), {}, {}, {}
    for i, item in enumerate(items):
        if item.stream in last_on:
            previous[i] = last_on[item.stream]
        last_on[item.stream] = i

    def issue_once(i):
        nonlocal stall
        if i in issued:
            return
        issued.add(i)
        item = items[i]
        if i in previous:
            issue_once(previous[i])
        start = max(item.issue + stall, stream_free.get(item.stream, -float("inf")))
        if item.depends is not None:
            issue_once(item.depends)
            start = max(start, end[item.depends])
        end[i] = start + item.duration
        stream_free[item.stream] = end[i]

    for point, order, i in events:
        issue_once(i)
        if order != 1:
            stall += max(0.0, end[i] - (point + stall))
    return fsdp.measured_exposed, stall


@pytest.mark.parametrize("scenario", [Scenario(), Scenario(gpus=64), Scenario(strategy="hsdp"),
                                      Scenario(strategy="hsdp", gpus=32), Scenario(strategy="fsdp-grad-op"),
                                      Scenario(nic_gbps=10.0)])
def test_fsdp_replay_planned_once_equals_one_built_per_projection(fsdp_two_nodes, scenario):
    """The replay planned once per rank-step and strategy pair (items, need points, event order)
    with the durations of each projection gives, bit for bit, the stalls of items built anew at
    every projection, and counts the collectives kept as measured the same way."""
    from analyzer.whatif.projection import _fsdp_step
    result = fsdp_two_nodes[2]
    base, assumptions = measured_config(result, scenario, [])
    target = target_config(base, scenario, assumptions)
    planned, per_projection = Durations(result, base, target), Durations(result, base, target)
    shared = Measured(result)
    for steps in (shared.steps, shared.steps):  # the second time from the plans kept
        assert [_fsdp_step(s, planned, base, target) for s in steps] == \
            [_fsdp_step_built_per_projection(s, per_projection, base, target) for s in steps]
    assert planned.kept == per_projection.kept
