"""tracecliff hang on NCCL-backend dumps written as torch writes them (analyzer.synth.flight_recorder,
from torch's FlightRecorder sources): the committed samples of scripts/make_nccl_fr_dumps.py with
their expected verdicts, the same jobs in every format version (1.4 to 2.10, pickle and JSON),
coalesced collectives and p2p batches, stuck vs in flight, and the world size when pg_config is
missing (--world-size, or the Kineto traces' distributedInfo)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from analyzer.hang import triage
from analyzer.hang.read import read_dump
from analyzer.synth import flight_recorder as fr
from hang_dumps import NCCL, SAMPLES, hang_summary, run

EXPECTED = json.loads((NCCL / "expected.json").read_text())
JOBS = [name for name in EXPECTED if not name.startswith("_")]
ONE_GROUP = ["nccl_missing_rank", "nccl_desync", "nccl_stuck", "nccl_stuck_kernel", "nccl_silent_highest"]


def in_flight(report) -> list[dict]:
    return [{"group": f["group"]["name"], "seq": f["seq"], "op": f["op"], "ranks": f["ranks"]} for f in report.in_flight]


def test_every_scenario_is_committed():
    assert sorted(JOBS) == sorted(fr.SCENARIOS)


@pytest.mark.parametrize("job", JOBS)
def test_committed_samples_are_what_the_script_writes(job, tmp_path):
    truth = fr.write_scenario(job, tmp_path / job)
    assert truth == EXPECTED[job]
    committed = sorted(p.name for p in (NCCL / job).iterdir())
    assert committed == sorted(p.name for p in (tmp_path / job).iterdir())
    for name in committed:
        assert (NCCL / job / name).read_bytes() == (tmp_path / job / name).read_bytes(), name


@pytest.mark.parametrize("job", JOBS)
def test_samples_give_their_expected_verdict(job, capsys):
    truth = EXPECTED[job]
    report = triage([str(NCCL / job)])
    assert hang_summary(report) == truth["hangs"]
    assert in_flight(report) == truth["in_flight"]
    if "proven" in truth:
        assert report.hangs[0].detail["pending"]["proven"] is truth["proven"]
    code, out, err = run(capsys, "hang", str(NCCL / job))
    assert (code, err) == (truth["exit"], "") and out.startswith("VERDICT: ")


@pytest.mark.parametrize("version", fr.VERSIONS)
@pytest.mark.parametrize("job", ONE_GROUP)
def test_every_format_version_gives_the_same_verdict(job, version, tmp_path):
    """Format 1.4 has one seq_id, no process_group, no dtypes, no timeout, pg_config by pg_id;
    2.2 no pg_status; 2.4, 2.7 and 2.10 also a JSON writer. The verdict must not change."""
    truth = fr.write_scenario(job, tmp_path, version=version)
    for fmt in ("pickle", "json") if version in fr.JSON_VERSIONS else ("pickle",):
        pattern = "nccl_trace_rank_*.json" if fmt == "json" else "nccl_trace_rank_[0-9]"
        report = triage([str(tmp_path / pattern)])
        assert hang_summary(report) == truth["hangs"], (version, fmt)
        assert {i["version"] for i in report.inputs} == {version}


@pytest.mark.parametrize("version", ["2.2", "2.4", "2.7", "2.10"])
def test_in_flight_and_p2p_jobs_in_2x_versions(version, tmp_path):
    for job in ("nccl_in_flight", "nccl_coalesced_p2p"):
        truth = fr.write_scenario(job, tmp_path / job, version=version)
        report = triage([str(tmp_path / job)])
        assert hang_summary(report) == truth["hangs"] and in_flight(report) == truth["in_flight"], (job, version)


@pytest.mark.parametrize("job", ["nccl_missing_rank", "nccl_desync", "nccl_stuck", "nccl_in_flight",
                                 "nccl_silent_highest", "nccl_coalesced_p2p"])
def test_without_start_events_the_verdict_stands(job, tmp_path):
    """ProcessGroupNCCL creates a work's start event only with TORCH_NCCL_ENABLE_TIMING (else
    it records nullptr): entries go from "scheduled" straight to "completed". Nothing but the
    kernel-never-started distinction may hang on "started"."""
    s = fr.SCENARIOS[job]()
    for rank in s.ranks.values():
        for op in rank.ops:
            op.state = "scheduled" if op.state == "started" else op.state
    _write(s, tmp_path)
    report = triage([str(tmp_path)])
    assert hang_summary(report) == s.truth["hangs"] and in_flight(report) == s.truth["in_flight"]


def test_without_start_events_a_busy_stream_is_not_told_from_the_network(tmp_path):
    """nccl_stuck_kernel without start events: nothing shows rank 2's kernel never started, so
    every member is named (stuck, proven by rank 0's timeout), never rank 2 alone on no evidence."""
    s = fr.stuck_kernel()
    for rank in s.ranks.values():
        for op in rank.ops:
            op.state = "scheduled" if op.state == "started" else op.state
    _write(s, tmp_path)
    hang = triage([str(tmp_path)]).hangs[0]
    assert (hang.kind, hang.ranks, hang.detail["started"], hang.detail["pending"]["proven"]) == \
        ("stuck", [0, 1, 2, 3], [], True)


def test_in_flight_says_why():
    report = triage([str(NCCL / "nccl_in_flight")])
    flying = report.in_flight[0]
    assert flying["pending_at_least_s"] < 0.01 and flying["timeout_s"] == 600.0
    assert flying["pending_estimate_s"] == pytest.approx(570.0, abs=0.01)  # 30 s after the root hang, 600 s timeout
    assert "entered by every member 30.000 s after group 2's all_reduce #9 began waiting" in flying["reason"]
    assert report.verdict.endswith("all_reduce #9 of group tp (pg 1) was in flight at the dump, not hung")


def test_stuck_without_proof_states_the_ambiguity():
    report = triage([str(NCCL / "nccl_stuck")])
    pending = report.hangs[0].detail["pending"]
    assert pending["proven"] is False and pending["timeout_s"] == 600.0 and pending["at_least_s"] < 1
    assert "the dumps do not record when they were written" in report.verdict


def test_stuck_past_its_timeout_by_the_dumps_own_clock(tmp_path):
    """A later entry (another group's, seen completed at the dump) shows the dumps were written
    more than the timeout after the stuck collective: proven."""
    s = fr.stuck()
    late = fr.RecordedOp("7", "ckpt", 3, "barrier", 1, fr.T0 + 700_000 * fr.MS)
    s.ranks[1].ops.append(late)
    s.groups["7"] = ("ckpt", [1])
    _write(s, tmp_path)
    hang = triage([str(tmp_path)]).hangs[0]
    assert (hang.kind, hang.seq, hang.detail["pending"]["proven"]) == ("stuck", 5, True)
    assert "past its 600 s timeout" in hang.detail["pending"]["why"]


def test_kernel_that_never_started_names_its_rank():
    hang = triage([str(NCCL / "nccl_stuck_kernel")]).hangs[0]
    assert hang.detail["started"] == [0, 1, 3] and hang.ranks == [2]
    assert "never started on rank(s) 2" in hang.detail["reason"]


def test_lagging_pg_status_of_rank_0_is_not_a_culprit():
    report = triage([str(NCCL / "nccl_missing_rank")])
    assert report.hangs[0].ranks == [3]
    assert report.hangs[0].detail["evidence"]["0"]["done"] is False  # #6 itself: started, not done
    assert report.ranks[0]["last_completed"]["seq"] == 5  # entries completed past its pg_status (#3)


def test_coalesced_block_is_one_operation_and_a_short_block_is_a_desync(tmp_path):
    ok = triage([str(NCCL / "nccl_coalesced_p2p")])
    assert [h.group.name for h in ok.hangs] == ["3"]  # the coalesced DP #3 matched
    s = fr.coalesced_p2p()
    s.ranks[1].ops = [op for op in s.ranks[1].ops if not (op.seq == 3 and not op.p2p and op.sizes == ((768,),))]
    _write(s, tmp_path)
    hang = triage([str(tmp_path)]).hangs[0]
    assert (hang.kind, hang.group.name, hang.seq, hang.detail["differs_in"]) == ("desync", "0", 3, ["collective"])
    assert hang.op == "coalesced" and hang.detail["coalesced_ops"] == ["all_reduce"] * 3  # the JSON names the marker
    assert ("rank 1 issued coalesced[all_reduce x2](sizes [[256], [512]], Float) where the others issued "
            "coalesced[all_reduce x3](sizes [[256], [512], [768]], Float) at #3") in triage([str(tmp_path)]).verdict


def test_before_2_7_a_coalescing_block_is_its_marker_alone(tmp_path):
    """torch records a coalescing block's collectives one entry each only from format 2.7
    (fr_trace: "We enabled the creating FR entry for non-P2P slow path collective ops in
    v2.7"); before, the "coalesced" marker alone stands for the block, while a p2p batch keeps
    an entry per op. The block still matches across ranks."""
    fr.write_scenario("nccl_coalesced_p2p", tmp_path, version="2.4")
    for name in ("nccl_trace_rank_0", "nccl_trace_rank_0.json"):
        dump = read_dump(tmp_path / name)
        assert [e.op for e in dump.entries if not e.is_p2p and e.collective_seq == 3] == ["coalesced"], name
        assert [e.op for e in dump.entries if e.is_p2p and e.p2p_seq == 1] == ["send", "coalesced"], name
    report = triage([str(tmp_path)])
    assert [(h.kind, h.group.name, h.seq) for h in report.hangs] == [("p2p-unmatched", "3", 2)]


def test_a_named_end_marker_closes_its_block_too(tmp_path):
    """endCoalescing with an op type names its marker after it ("ALLGATHER_coalesced",
    "REDUCE_SCATTER_coalesced": fr_trace's list of collectives): the block is one operation
    whatever its marker is called, and a short block is a desync named by that marker."""
    s = fr.coalesced_p2p()
    for rank in s.ranks.values():
        for op in rank.ops:
            if not op.p2p and op.seq == 3:
                op.op = "_allgather_base" if op.op == "all_reduce" else "ALLGATHER_coalesced"
    _write(s, tmp_path)
    assert [h.group.name for h in triage([str(tmp_path)]).hangs] == ["3"]
    s.ranks[1].ops = [op for op in s.ranks[1].ops if not (op.seq == 3 and not op.p2p and op.sizes == ((768,),))]
    _write(s, tmp_path)
    hang = triage([str(tmp_path)]).hangs[0]
    assert (hang.kind, hang.group.name, hang.seq, hang.op) == ("desync", "0", 3, "ALLGATHER_coalesced")
    assert hang.ranks == [1] and hang.detail["tie"]  # two ranks: the lower one's call is the expected one


def test_p2p_batch_state_comes_from_its_marker(tmp_path):
    """Batch #1's send and recv have no events of their own; the marker completed them."""
    s = fr.coalesced_p2p()
    s.ranks[0].ops = s.ranks[0].ops[:-1]  # without the unmatched send #2
    _write(s, tmp_path)
    assert triage([str(tmp_path)]).hangs == []


def test_missing_pg_config_needs_the_world_size(tmp_path, capsys):
    s = replace(fr.silent_highest(), pg_config=False)
    _write(s, tmp_path)
    report = triage([str(tmp_path)])
    assert report.world["source"].startswith("inferred") and report.world["size"] == 7
    assert [h.kind for h in report.hangs] == ["stuck"]  # seven ranks inside #3, none done
    code, out, _ = run(capsys, "hang", str(tmp_path), "--world-size", "8")
    assert code == 1 and out.startswith("VERDICT: rank 7 wrote no dump (dead host?)")


def test_world_size_and_history_from_the_kineto_traces(tmp_path, capsys):
    """ddp_straggler's traces (8 ranks, rank 5 computes 30% slower): the world size is theirs,
    and the silent rank 7 was not the late rank; rank 5 was."""
    _write(replace(fr.silent_highest(), pg_config=False), tmp_path)
    code, out, _ = run(capsys, "hang", str(tmp_path), "--traces", str(SAMPLES.parent / "synthetic" / "ddp_straggler"),
                       "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["world"]["size"] == 8 and doc["world"]["source"].startswith("the Kineto traces'")
    assert doc["hangs"][0]["kind"] == "not-reporting" and doc["hangs"][0]["ranks"] == [7]
    assert doc["history"]["source"] == "the straggler-rank rule" and list(doc["history"]["late_ranks"]) == ["5"]
    assert doc["history"]["culprits"]["7"] == {"traced": True, "already_late": False, "why": None, "late_steps": [],
                                               "of_steps": 3}
    assert "rank 7 was not the late rank in the profiled steps: rank 5 was (Rank 5 causes" in doc["verdict"]


def test_culprit_that_was_the_straggler(tmp_path, capsys):
    s = fr.missing_rank()
    world = list(range(8))
    s.groups = {"0": ("default_pg", world)}
    s.ranks = {r: fr.RecordedRank(fr._dp_ops(6, last_state="started")) for r in world}
    s.ranks[5] = fr.RecordedRank(fr._dp_ops(5))
    _write(s, tmp_path)
    code, out, _ = run(capsys, "hang", str(tmp_path), "--traces", str(SAMPLES.parent / "synthetic" / "ddp_straggler"))
    first = out.splitlines()[0]
    assert code == 1 and first.startswith("VERDICT: rank 5 never entered all_reduce #6")
    assert "rank 5 was already the late rank in the profiled steps (the last in 3 of 3 steps: Rank 5 causes" in first


def test_traces_of_another_job_give_no_history(tmp_path, capsys):
    fr.write_scenario("nccl_missing_rank", tmp_path)  # 4 ranks by pg_config
    code, out, _ = run(capsys, "hang", str(tmp_path), "--traces", str(SAMPLES.parent / "synthetic" / "ddp_straggler"),
                       "--format", "json")
    doc = json.loads(out)
    assert doc["history"]["mismatch"] is True and "late rank" not in doc["verdict"]
    assert any("not the same job" in w for w in doc["warnings"])


def _write(s: fr.RecordedScenario, folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in s.ranks:
        (folder / f"nccl_trace_rank_{rank}").write_bytes(fr.dump(s, rank, "pickle"))


def test_proof_leads_and_a_collective_in_flight_elsewhere_is_not_blamed():
    """Ranks 4-7: rank 5 never enters all_reduce #7; ranks 0-3 entered theirs 2 ms earlier and
    were inside it when the dumps were taken: the verdict names rank 5, and the other group's
    collective is 'in flight when dumped, not proven stuck', never the network."""
    report = triage([str(NCCL / "nccl_two_groups_in_flight")])
    assert report.verdict.startswith("rank 5 never entered all_reduce #7 of group dp_b")
    assert "network" not in report.verdict
    assert "all_reduce #7 of group dp_a (pg 1) was in flight when dumped, not proven stuck" in report.verdict
    (flying,) = report.in_flight
    assert flying["status"] == "in flight when dumped, not proven stuck" and flying["pending_at_least_s"] < 600


def test_a_hang_that_follows_from_another_says_so():
    """Rank 2 never enters DP #5; rank 0 waits inside it and so never enters TP #5, where rank 1
    waits: the DP hang leads, the TP one is named as its possible consequence."""
    report = triage([str(NCCL / "nccl_consequence")])
    first, second = report.hangs
    assert (first.group.name, first.ranks) == ("1", [2]) and (second.group.name, second.ranks) == ("2", [0])
    assert second.detail["consequence_of"] == {"group": "1", "seq": 5, "op": "all_reduce", "kind": "missing-rank",
                                               "blocked_ranks": [0]}
    assert "all_reduce #5 of group 2 may be its consequence: rank(s) 0 wait in all_reduce #5 of group 1" in report.verdict


def test_an_unproven_stuck_collective_ranks_after_a_proven_hang():
    """With no timing to call it in flight (entered long before, no timeout recorded), a stuck
    collective nobody proves stays a hang, but after the one the dumps prove."""
    from analyzer.hang.analyze import Group, Hang, rank_hangs
    g1, g2 = Group("1", "a", [0, 1], "pg_config"), Group("2", "b", [2, 3], "pg_config")
    unproven = Hang(g1, 3, "stuck", "all_reduce", [0, 1], [], 10, {"pending": {"proven": False}})
    missing = Hang(g2, 3, "missing-rank", "all_reduce", [3], [2], 20)
    proven = Hang(g1, 3, "stuck", "all_reduce", [0, 1], [], 5, {"pending": {"proven": True}})
    assert rank_hangs([unproven, missing]) == [missing, unproven]
    assert rank_hangs([missing, proven]) == [proven, missing]
