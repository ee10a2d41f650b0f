"""Point-to-point pairing across ranks (analyzer.job.p2p): each send with its receive by
(group, source, destination, n-th of that direction in posting order), measured as a
collective's set is (transfer = the shorter kernel, wait = duration − transfer)."""

import gzip
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.job.crossrank import analyze, match
from analyzer.rank.p2p import members
from analyzer.synth.parallel import PARALLEL_SCENARIOS, plan_step, write_parallel_job

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
GROUP = {"name": "0", "ranks": [0, 1, 2], "size": 3, "description": "default_pg"}


def p2p(rank, launch, start, dur, peers, kind=None):
    kind = kind or (peers[0][0] if len({m[0] for m in peers}) == 1 else "sendrecv")
    return {"rank": rank, "start_us": start, "dur_us": dur, "launch_us": launch, "step": 1, "collective": kind,
            "group": GROUP, "seq": None, "comms_id": None, "peers": [[k, p, None] for k, p in peers]}


def test_two_directions_interleaved_pair_in_posting_order():
    """Rank 0 posts send→1, recv←1, send→1; rank 1 posts recv←0, send→0, recv←0. The k-th send
    of a direction goes with the k-th receive of it, whatever the other direction does."""
    rows = [p2p(0, 0, 10, 50, [("send", 1)]),     # 0→1 #0: ends with rank 1's recv at 60
            p2p(0, 5, 60, 40, [("recv", 1)]),     # 1→0 #0: posted at 60, data at 100
            p2p(0, 7, 200, 30, [("send", 1)]),    # 0→1 #1
            p2p(1, 1, 40, 20, [("recv", 0)]),     # 0→1 #0
            p2p(1, 2, 70, 30, [("send", 0)]),     # 1→0 #0
            p2p(1, 3, 150, 80, [("recv", 0)])]    # 0→1 #1: posted at 150, waits 50
    summary = analyze(rows)
    assert summary["method"] == "p2p_order" and summary["matched_collectives"] == 3
    # transfer = the shorter kernel of each pair: 20, 30, 30
    assert [r["wait_us"] for r in rows] == [30.0, 10.0, 0.0, 0.0, 0.0, 50.0]
    assert [r["waited_for"] for r in rows] == [1, 1, None, None, None, 0]


def test_a_batch_pairs_only_one_to_one():
    """Rank 0's batch {send→1, recv←1} pairs with rank 1's batch {recv←0, send→0}; rank 2's
    batch {send→0, send→1} spans two peers: it and both receives stay unmatched."""
    rows = [p2p(0, 0, 0, 40, [("send", 1), ("recv", 1)]),
            p2p(1, 0, 10, 30, [("recv", 0), ("send", 0)]),
            p2p(2, 0, 100, 25, [("send", 0), ("send", 1)]),
            p2p(0, 1, 90, 35, [("recv", 2)]),
            p2p(1, 1, 95, 30, [("recv", 2)])]
    summary = analyze(rows)
    assert summary["matched_collectives"] == 1
    assert [r["wait_us"] for r in rows] == [10.0, 0.0, None, None, None]


def test_count_mismatch_leaves_that_direction_unmatched():
    """A window edge cut 2→0 (two sends, one receive): no alignment is sure, 2→0 stays
    unmatched; 0→2 (counts agree) is paired."""
    rows = [p2p(2, 0, 0, 10, [("send", 0)]), p2p(2, 1, 50, 10, [("send", 0)]),
            p2p(0, 0, 45, 15, [("recv", 2)]),
            p2p(0, 2, 100, 10, [("send", 2)]), p2p(2, 2, 80, 30, [("recv", 0)])]
    analyze(rows)
    assert [r["wait_us"] for r in rows] == [None, None, None, 0.0, 20.0]


def test_p2p_never_keys_on_their_own_ids_and_collectives_keep_theirs():
    """With collectives matched by Comms Id, the pairs are added with codes of their own."""
    coll = [{**p2p(r, 0, 0, d, [("send", 1)]), "collective": "allreduce", "peers": None, "comms_id": 7}
            for r, d in ((0, 10), (1, 4))]
    for r in coll:
        del r["peers"]
    rows = coll + [p2p(0, 5, 20, 9, [("send", 1)]), p2p(1, 5, 15, 14, [("recv", 0)])]
    summary = analyze(rows)
    assert summary["method"] == "comms_id" and summary["matched_collectives"] == 2
    assert [r["wait_us"] for r in rows] == [6.0, 0.0, 0.0, 5.0]


def test_peer_outside_the_group_or_self_is_no_peer():
    # ``Rank`` (the peer's rank in the group) beyond the group, or naming this rank itself
    assert members("send", {"peer_rank": 5}, None, None, GROUP, 0) == (None, True)
    assert members("recv", {"src_rank": 7}, None, None, GROUP, 0) == (None, True)
    assert members("send", {"dst_rank": 0}, None, None, GROUP, 0) == (None, True)
    # a group rank is mapped to the global one through the group's ranks
    sub = {"name": "3", "ranks": [4, 6], "size": 2}
    assert members("send", {"peer_rank": 1}, None, None, sub, 4) == ([["send", 6, None]], False)
    assert members("recv", {}, "nccl:recv 1<-0", None, sub, 6) == ([["recv", 4, None]], False)
    assert members("recv", {}, "c10d::recv_", {"concrete_inputs": ["", "", "0", "3"]}, sub, 6) == \
        ([["recv", 4, 3]], False)
    # rows whose peer is unknown stay out of every pair
    rows = [p2p(0, 0, 0, 10, [("send", 1)]), {**p2p(1, 0, 0, 10, [("recv", 0)]), "peers": None}]
    analyze(rows)
    assert [r["wait_us"] for r in rows] == [None, None]


# -- the synthetic pipeline: its construction is the truth ----------------------------------

@pytest.mark.parametrize("name", ["pp_gpipe_4stage", "pp_gpipe_4stage_16mb"])
def test_synthetic_pipeline_pairs_each_send_with_its_recv(tmp_path, name):
    """The generator with ``peer_fields``: every stage-to-stage transfer lasts ``transfer_us``;
    a recv posted early spins until its send ends (the two end together). Each paired set is a
    send and a recv of adjacent stages ending together, the send waiting for nobody and the
    recv waiting its duration less the transfer. The forward directions hold one receive more
    than sends (the first recv was posted in the step before the window, and the last one
    lands after it): left unmatched; every backward transfer is paired."""
    from analyzer.api import DiagnoseOptions, diagnose
    spec = replace(PARALLEL_SCENARIOS[name], peer_fields=True)
    result = diagnose([str(write_parallel_job(spec, tmp_path / name))], DiagnoseOptions(workers=1))
    rows = result.collectives
    paired = [r for r in rows if r["wait_us"] is not None]
    c = spec.transfer_us
    backward = spec.steps * spec.microbatches * (spec.pp - 1)
    assert len(paired) == 2 * backward
    sets: dict = {}
    for r in paired:
        kind, peer, _ = r["peers"][0]
        src, dst = (r["rank"], peer) if kind == "send" else (peer, r["rank"])
        assert dst == src - 1  # backward only
        sets.setdefault((src, round(r["start_us"] + r["dur_us"], 3)), []).append(r)
    assert len(sets) == backward and all(len(s) == 2 for s in sets.values())
    for pair in sets.values():
        send, recv = sorted(pair, key=lambda r: r["collective"] != "send")
        assert (send["collective"], recv["collective"]) == ("send", "recv")
        assert send["dur_us"] == c and send["wait_us"] == 0.0
        assert recv["wait_us"] == pytest.approx(recv["dur_us"] - c) and recv["waited_for"] == send["rank"]
    # the construction's backward recv waits, stage by stage (one step's plan, every step alike)
    for s in range(spec.pp - 1):
        plan = plan_step(spec, s)
        truth = sorted(op.dur - c for op in plan.ops if op.coll == "recv" and op.peer == s + 1)
        got = sorted(r["wait_us"] for r in paired if r["rank"] == s and r["collective"] == "recv")
        assert got == pytest.approx(sorted(truth * spec.steps))
    forward = [r for r in rows if r["peers"][0][0] == "send" and r["peers"][0][1] == r["rank"] + 1]
    assert forward and all(r["wait_us"] is None for r in forward)
    # the unpaired ones keep the α-β estimate the job had without pairs, the paired ones are
    # measured: the verdict and the findings' gains are those of the job without peer fields, and
    # no stage is named a straggler for the pipeline's own dependency
    plain = diagnose([str(write_parallel_job(PARALLEL_SCENARIOS[name], tmp_path / "plain"))], DiagnoseOptions(workers=1))
    assert "p2p_order" in result.attribution["wait_source"] and "unpaired" in result.attribution["wait_source"]
    assert result.verdict == plain.verdict
    assert [(f["rule"], f["estimated_gain_us"]) for f in result.findings] == \
        [(f["rule"], f["estimated_gain_us"]) for f in plain.findings]
    assert result.attribution["exposed_wait_us"] == pytest.approx(plain.attribution["exposed_wait_us"], abs=0.01)
    peers = {k for rank in result.ranks for st in rank.steps for k in st["time_breakdown"]["wait_by_peer"]}
    assert "rank 1 (send/recv)" in peers and not any(k.isdigit() for k in peers)


def test_committed_pipeline_samples_record_no_peers():
    """``peer_fields`` is off in the committed samples (they regenerate byte for byte): their
    p2p rows have no peers and stay unmatched."""
    path = SAMPLES / "synthetic" / "pp_gpipe_4stage" / "rank-1.json.gz"
    if not path.exists():
        path = next((SAMPLES / "synthetic" / "pp_gpipe_4stage").glob("rank-1*"))
    events = json.loads(gzip.open(path).read())["traceEvents"]
    assert not any("Src Rank" in e.get("args", {}) for e in events)


# -- a real gloo recording: c10d::send / recv_ with their Concrete Inputs --------------------

def _raw_pairs(folder: Path) -> Counter:
    """(source, destination) counts of the sends and receives in the raw traces: the peer is
    the third Concrete Input (a rank of the default group, here the global rank)."""
    sends, recvs = Counter(), Counter()
    for path in sorted(folder.glob("rank-*.json.gz")):
        doc = json.loads(gzip.open(path).read())
        me = doc["distributedInfo"]["rank"]
        for e in doc["traceEvents"]:
            if e.get("name") == "c10d::send":
                sends[(me, int(e["args"]["Concrete Inputs"][2]))] += 1
            elif e.get("name") == "c10d::recv_":
                recvs[(int(e["args"]["Concrete Inputs"][2]), me)] += 1
    return sends, recvs


def test_gloo_pipeline_every_send_pairs_with_its_recv():
    from analyzer.api import DiagnoseOptions, diagnose
    folder = SAMPLES / "cpu_gloo" / "pp"
    sends, recvs = _raw_pairs(folder)
    assert sends == recvs and sum(sends.values()) == 48
    result = diagnose([str(folder)], DiagnoseOptions(workers=1))
    assert result.stragglers["method"] == "p2p_order" and result.stragglers["matched_collectives"] == 48
    rows = [r for r in result.collectives if r["collective"] in ("send", "recv")]
    assert len(rows) == 96 and all(r["wait_us"] is not None for r in rows)
    got = Counter()
    for r in rows:
        kind, peer, tag = r["peers"][0]
        if kind == "send":
            got[(r["rank"], peer)] += 1
        assert r["wait_us"] >= 0
    assert got == sends
    # each set: a send and the receive of the same direction and the same place in it (the raw
    # posting order of each side), the shorter one waiting for nobody, the other its duration less
    method, sets = match(result.collectives)
    assert method == "p2p_order" and len(sets) == 48
    # (rows are made afresh from the result's columns on each read: keyed by position, not identity)
    every = list(result.collectives)
    nth = {}
    for side in ("send", "recv"):
        mine = sorted((i for i, r in enumerate(every) if r["collective"] == side),
                      key=lambda i: (every[i]["rank"], every[i]["launch_us"]))
        seen: Counter = Counter()
        for i in mine:
            r = every[i]
            key = (r["rank"], r["peers"][0][1]) if side == "send" else (r["peers"][0][1], r["rank"])
            nth[i] = (key, seen[key])
            seen[key] += 1
    for members_ in sets.values():
        send_at, recv_at = sorted(members_, key=lambda i: every[i]["collective"] != "send")
        send, recv = every[send_at], every[recv_at]
        assert (send["collective"], recv["collective"]) == ("send", "recv")
        assert nth[send_at] == nth[recv_at]
        transfer = min(send["dur_us"], recv["dur_us"])
        for r in (send, recv):
            assert r["wait_us"] == pytest.approx(r["dur_us"] - transfer, abs=1e-3)


# -- a coalesced batch as NCCL records it: its ops' record_param_comms, then one launch ----------

def _batch_trace(rank: int, start_us: int, end_us: int) -> dict:
    """One step of one rank: ``batch_isend_irecv`` with the other rank (a send and a recv, each
    a record_param_comms that launches nothing, ``Src Rank`` / ``Dst Rank`` global), then the
    batch's one SendRecv kernel, launched outside them, running from ``start_us`` to ``end_us``."""
    peer = 1 - rank
    pg = {"Process Group Name": "0", "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
          "Group size": 2, "dtype": "BFloat16", "In msg nelems": 1024, "Out msg nelems": 1024}
    t0 = 1_000_000.0

    def cpu(name, ts, dur, **args):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t0 + ts, "dur": dur, "args": args}

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": t0,
               "dur": 1000.0, "args": {}},
              cpu("record_param_comms", start_us - 90, 5, **{**pg, "Collective name": "send", "Src Rank": rank, "Dst Rank": peer}),
              cpu("record_param_comms", start_us - 80, 5, **{**pg, "Collective name": "recv", "Src Rank": peer, "Dst Rank": rank}),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + start_us - 60,
               "dur": 2.0, "args": {"correlation": 7, "cbid": 211}},
              {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
               "pid": 0, "tid": 20, "ts": t0 + start_us, "dur": float(end_us - start_us),
               "args": {"device": 0, "stream": 20, "correlation": 7}},
              {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
               "pid": 0, "tid": 7, "ts": t0 + 500, "dur": 300.0, "args": {"device": 0, "stream": 7, "correlation": 8}}]
    info = {"backend": "nccl", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1],
                           "backend_config": "cuda:nccl"}]}
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}


def test_a_coalesced_batch_kernel_takes_its_ops_as_members(tmp_path):
    """Both batch kernels end when the last transfer lands (400 µs): rank 0 posted at 100 and
    spins, rank 1 posted at 370: its kernel (30 µs) is the transfer, rank 0 waited 270 µs for
    rank 1. The kernel's members are the batch's two ops, in their recorded order."""
    for rank, (start, end) in {0: (100, 400), 1: (370, 400)}.items():
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(_batch_trace(rank, start, end)))
    from analyzer.api import DiagnoseOptions, diagnose
    result = diagnose([str(tmp_path)], DiagnoseOptions(workers=1))
    rows = sorted(result.collectives, key=lambda r: r["rank"])
    assert [r["collective"] for r in rows] == ["sendrecv", "sendrecv"]
    assert [r["peers"] for r in rows] == [[["send", 1, None], ["recv", 1, None]], [["send", 0, None], ["recv", 0, None]]]
    assert [r["wait_us"] for r in rows] == [270.0, 0.0] and rows[0]["waited_for"] == 1
