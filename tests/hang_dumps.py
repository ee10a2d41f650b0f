"""Synthetic Flight Recorder dumps with built-in truth, for tests/test_hang*.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "flight_recorder"
SCENARIOS = ["healthy", "skip_collective", "different_collectives", "sleep_past_timeout", "size_mismatch"]
JOBS = ["subgroups_skip", "status_lag", "silent_highest", "async_buckets"]  # record_fr_dumps.py's later jobs: both formats, one folder
NCCL = SAMPLES / "nccl"  # scripts/make_nccl_fr_dumps.py


def run(capsys, *args):
    """(exit code, stdout, stderr) of the CLI."""
    import pytest

    from analyzer.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def hang_summary(report) -> list[dict]:
    """What expected.json holds of each hang."""
    out = []
    for h in report.hangs:
        row = {"kind": h.kind, "group": h.group.name, "seq": h.seq, "op": h.op, "ranks": h.ranks,
               "waiting_ranks": h.waiting_ranks}
        if "differs_in" in h.detail:
            row["differs_in"] = h.detail["differs_in"]
        out.append(row)
    return out


def entry(seq: int, op: str = "all_reduce", *, group: tuple[str, str] = ("0", "default_pg"), pg_id: int = 0,
          state: str = "completed", sizes=((4,),), dtype: str = "Float", p2p_seq: int = 0, peer: str = "",
          backend: str = "nccl", t: int | None = None, frames: list | None = None,
          retired: bool | None = None) -> dict[str, Any]:
    """One 2.10-format entry; ``seq`` is the collective (or, for send/recv, the p2p) sequence id.
    ``retired`` defaults to what NCCL's watchdog does: a completed work is retired, a pending one
    not (retired without completing = timed out)."""
    is_p2p = op in ("send", "recv")
    return {"record_id": seq, "pg_id": pg_id, "process_group": list(group),
            "collective_seq_id": 0 if is_p2p else seq, "p2p_seq_id": seq if is_p2p else p2p_seq,
            "op_id": seq, "is_p2p": is_p2p, "profiling_name": f"{backend}:{op}{' ' + peer if peer else ''}",
            "time_created_ns": t if t is not None else 1_700_000_000_000_000_000 + seq * 10**9,
            "input_sizes": [list(s) for s in sizes], "output_sizes": [list(s) for s in sizes],
            "input_dtypes": [dtype], "output_dtypes": [dtype], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": state == "completed" if retired is None else retired,
            "timeout_ms": 600000, "frames": frames or []}


def dump(entries: list[dict], pg_config: dict | None = None, pg_status: dict | None = None,
         version: str = "2.10") -> dict[str, Any]:
    return {"version": version, "comm_lib_version": "2.21.5", "pg_config": pg_config or {},
            "pg_status": pg_status or {}, "entries": entries}


def config(name: str, desc: str, ranks: list[int]) -> dict[str, Any]:
    return {name: {"name": name, "desc": desc, "ranks": str(ranks)}}


def write_job(directory: Path, per_rank: dict[int, dict], fmt: str = "json") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, doc in per_rank.items():
        if fmt == "json":
            (directory / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(doc))
        else:
            (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(doc))
    return directory
