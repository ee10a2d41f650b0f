"""Inputs with an extreme value in one numeric field (issue 30), made from the sample traces,
Flight Recorder dumps and a saved result, and an in-process runner that records each command's
exit, output and time.

Each case changes one field of rank 0 of a small job (on the first event that has it, as a
hand-edited or damaged trace would) to a value no job can have: beyond int64 or uint64, a
message larger than any GPU's memory, a rank beyond any cluster or the world size, a negative
identity, a step numbered 10**20. A field whose value lies beyond what it can plausibly hold
must be said: a warning naming the field (exit 0/1), or one line naming the file (exit 2).

``python tests/extreme_inputs.py OUTDIR [--only SUBSTRING]`` writes the cases and prints each
command's verdict, exit code, time and what it said.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import pickle
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgspec

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"

# Beyond int64, beyond uint64, just past int64, a message past any memory, negative.
HUGE, NEG_HUGE, PAST_U64, PAST_I64, BIG, NEGATIVE = 2**70, -2**70, 2**64, 2**63, 2**50, -5
INT_VALUES = (HUGE, NEG_HUGE, PAST_U64, PAST_I64, BIG, NEGATIVE)
FLOAT_VALUES = (1e300, -1e300)
# CI's share (the long run takes every value and command): gate and whatif run on FEW, diagnose
# and hang on these as well, besides each field's own boundary values (a world size of 2**18+1,
# rank 8 of 8, Comms Id past uint64...): -2**70 and 2**64 behave as 2**70 and 2**63 elsewhere.
FEW = (HUGE, BIG, NEGATIVE, 1e300)
CI_ALSO = (PAST_I64, -1e300)

ID = (-2**63, 2**63 - 1)  # ids: a negative one means "none", as it always has
WORLD_RANK = (0, 2**18 - 1)
NONNEG = (0, 2**63 - 1)


@dataclass(frozen=True)
class Case:
    name: str          # "<job>/<field>=<value>"
    job: str           # "ddp", "fsdp", "gloo", "pp", "hang-json", "hang-pickle" or "result"
    says: str | None   # what a warning or error about the field contains (None: any value is fine)
    must_say: bool     # the value is beyond what the field can plausibly hold: it must be said
    path: Path         # the job's directory (rank 0 changed), or the result file
    level: int = 0  # 0: every command in CI; 1: diagnose or hang only in CI; 2: the long run only


@dataclass(frozen=True)
class Field:
    jobs: tuple[str, ...]
    change: Callable[[Any, Any], None]
    values: tuple
    says: str | None  # what a warning or error about it contains
    bounds: tuple[float, float] | None  # plausible values, inclusive; None: a label, or unread


# -- changing one field --------------------------------------------------------------------------

def _set_path(*keys):
    """Set ``doc[k0][k1]...`` (dicts and lists)."""
    def change(doc, value):
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value
    return change


def _is_comm_kernel(e: dict) -> bool:
    return e.get("cat") == "kernel" and "In msg nelems" in e.get("args", {})


def _is_params(e: dict) -> bool:
    return e.get("name") == "record_param_comms" and "In msg nelems" in e.get("args", {})


def _is_c10d(e: dict) -> bool:
    return str(e.get("name", "")).startswith("c10d::") and "Input Dims" in e.get("args", {})


def _is_launch(e: dict) -> bool:
    return e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})


def _is_memory(e: dict) -> bool:
    return e.get("name") == "[memory]"


def _is_step(e: dict) -> bool:
    return str(e.get("name", "")).startswith("ProfilerStep#")


def _is_comm(e: dict) -> bool:
    """The event that carries a collective's size: the kernel (newer Kineto), else the
    record_param_comms, else (gloo) the c10d op (see ``_event``)."""
    return _is_comm_kernel(e)


def _event(doc: dict, test: Callable[[dict], bool]) -> dict:
    tests = (_is_comm_kernel, _is_params, _is_c10d) if test is _is_comm else (test,)
    for one in tests:
        found = next((e for e in doc["traceEvents"] if isinstance(e, dict) and one(e)), None)
        if found is not None:
            return found
    raise LookupError(f"no event for {test.__name__}")


def _arg(test, key):
    def change(doc, value):
        _event(doc, test)["args"][key] = value
    return change


def _key(test, key):
    def change(doc, value):
        _event(doc, test)[key] = value
    return change


def _group_ranks_text(doc, value):
    _event(doc, _is_comm)["args"]["Process Group Ranks"] = f"[0, {value}]"


def _input_dim(doc, value):
    _event(doc, _is_c10d)["args"]["Input Dims"][0][0][0] = value  # a TensorList's first tensor


def _p2p_arg(kind, key):
    """Set ``key`` on rank 0's first send's (recv's) record_param_comms: the peer fields are read
    for point-to-point ops only (analyzer.ingest.p2p)."""
    def change(doc, value):
        found = next(e for e in doc["traceEvents"]
                     if _is_params(e) and e["args"].get("Collective name") == kind)
        found["args"][key] = value
    return change


def _step_name(doc, value):
    _event(doc, _is_step)["name"] = f"ProfilerStep#{value}"


NELEMS = (-1, 2**35)  # -1: Kineto's "none"; 2**35 bf16 elements fit an 80 GB device
TRACE_FIELDS: dict[str, Field] = {
    "ts": Field(("ddp", "gloo"), _key(_is_comm, "ts"), INT_VALUES + FLOAT_VALUES, "ts/dur", (-2**52, 2**52)),
    "dur": Field(("ddp",), _key(_is_comm, "dur"), INT_VALUES + FLOAT_VALUES, "ts/dur", (0, 6.048e11)),
    "name": Field(("ddp",), _key(_is_comm, "name"), (HUGE, 1e300), None, None),  # a name written as a number
    "pid": Field(("ddp",), _key(_is_comm, "pid"), INT_VALUES, None, None),
    "tid": Field(("ddp",), _key(_is_launch, "tid"), INT_VALUES, None, None),
    "correlation": Field(("ddp",), _arg(_is_comm, "correlation"), INT_VALUES, "args.correlation", ID),
    "launch correlation": Field(("ddp",), _arg(_is_launch, "correlation"), INT_VALUES, "args.correlation", ID),
    "External id": Field(("ddp",), _arg(_is_params, "External id"), INT_VALUES, "args.External id", ID),
    "stream": Field(("ddp",), _arg(_is_comm, "stream"), INT_VALUES, "args.stream", ID),
    "In msg nelems": Field(("ddp", "fsdp"), _arg(_is_comm, "In msg nelems"), INT_VALUES + (2**40,),
                           "In msg nelems", NELEMS),
    "Out msg nelems": Field(("ddp", "fsdp"), _arg(_is_comm, "Out msg nelems"), INT_VALUES, "Out msg nelems", NELEMS),
    "record_param_comms In msg nelems": Field(("ddp",), _arg(_is_params, "In msg nelems"), INT_VALUES,
                                              "In msg nelems", NELEMS),
    "Group size": Field(("ddp", "fsdp"), _arg(_is_comm, "Group size"), INT_VALUES, "Group size", (-1, 2**18)),
    "Seq": Field(("ddp",), _arg(_is_params, "Seq"), INT_VALUES, "args.Seq", (-1, 2**63 - 1)),
    "Comms Id": Field(("ddp",), _arg(_is_params, "Comms Id"), INT_VALUES, "args.Comms Id", (-1, 2**64 - 1)),
    "Process Group Ranks": Field(("ddp",), _group_ranks_text, INT_VALUES, "Process Group Ranks", WORLD_RANK),
    # a send's / recv's peer: global (Dst Rank on a send, Src Rank on a recv), or in the group (Rank)
    "Dst Rank": Field(("pp",), _p2p_arg("send", "Dst Rank"), INT_VALUES, "args.Dst Rank", (-1, 2**18 - 1)),
    "Src Rank": Field(("pp",), _p2p_arg("recv", "Src Rank"), INT_VALUES, "args.Src Rank", (-1, 2**18 - 1)),
    "Rank": Field(("pp",), _p2p_arg("send", "Rank"), INT_VALUES, "args.Rank", (-1, 2**18 - 1)),
    "Process Group Name": Field(("ddp",), _arg(_is_comm, "Process Group Name"), (HUGE, NEGATIVE), None, None),
    "Input Dims": Field(("gloo",), _input_dim, INT_VALUES, "Input Dims", (0, 2**35)),
    "ProfilerStep#": Field(("ddp", "gloo"), _step_name, (10**20, PAST_I64, NEGATIVE, -1), "ProfilerStep",
                           (0, 2**53 - 1)),
    "distributedInfo.rank": Field(("ddp", "gloo"), _set_path("distributedInfo", "rank"), INT_VALUES + (8, 7),
                                  "distributedInfo.rank", (0, 7)),
    "distributedInfo.world_size": Field(("ddp",), _set_path("distributedInfo", "world_size"),
                                        INT_VALUES + (2**18 + 1,), "world_size", (1, 2**18)),
    "distributedInfo.pg_count": Field(("ddp",), _set_path("distributedInfo", "pg_count"), (HUGE, NEGATIVE),
                                      None, None),
    "pg_config.pg_size": Field(("ddp",), _set_path("distributedInfo", "pg_config", 0, "pg_size"), INT_VALUES,
                               "pg_size", (0, 8)),
    "pg_config.ranks": Field(("ddp",), _set_path("distributedInfo", "pg_config", 0, "ranks", -1), INT_VALUES,
                             "pg_config[0].ranks", (0, 7)),
    "pg_config.pg_name": Field(("ddp",), _set_path("distributedInfo", "pg_config", 0, "pg_name"), (HUGE,),
                               None, None),
    "deviceProperties.totalGlobalMem": Field(("ddp",), _set_path("deviceProperties", 0, "totalGlobalMem"),
                                             INT_VALUES, "totalGlobalMem", (0, 2**40)),
    "deviceProperties.id": Field(("ddp",), _set_path("deviceProperties", 0, "id"), (HUGE, NEGATIVE), None, None),
    "deviceProperties.computeMajor": Field(("ddp",), _set_path("deviceProperties", 0, "computeMajor"), (HUGE,),
                                           None, None),
    "deviceProperties.computeMinor": Field(("ddp",), _set_path("deviceProperties", 0, "computeMinor"), (HUGE,),
                                           None, None),
    "deviceProperties.name": Field(("ddp",), _set_path("deviceProperties", 0, "name"), (HUGE,), None, None),
    "baseTimeNanoseconds": Field(("gloo",), _set_path("baseTimeNanoseconds"), (HUGE, NEG_HUGE), None, None),
    "schemaVersion": Field(("ddp",), _set_path("schemaVersion"), (HUGE,), None, None),
    # the allocator's events (profile_memory=True): a size past any device is unknown, and said
    "Bytes": Field(("memory",), _arg(_is_memory, "Bytes"), FEW, "[memory]", (-2**40, 2**40)),
    "Total Allocated": Field(("memory",), _arg(_is_memory, "Total Allocated"), FEW, "[memory]", (-2**40, 2**40)),
    "Total Reserved": Field(("memory",), _arg(_is_memory, "Total Reserved"), (HUGE, 1e300), "[memory]",
                            (-2**40, 2**40)),
    "Device Type": Field(("memory",), _arg(_is_memory, "Device Type"), (HUGE, NEGATIVE), None, None),
    "Device Id": Field(("memory",), _arg(_is_memory, "Device Id"), (HUGE, NEGATIVE), None, None),
}


def _last_entry(key):
    def change(doc, value):
        doc["entries"][-1][key] = value
    return change


def _size_dim(doc, value):
    doc["entries"][-1]["input_sizes"][0][0] = value


def _pg_config_ranks(doc, value):
    next(iter(doc["pg_config"].values()))["ranks"] = f"[0, 1, 2, {value}]"


def _pg_status(key):
    def change(doc, value):
        next(iter(doc["pg_status"].values()))[key] = str(value)
    return change


DUMP_FIELDS: dict[str, Field] = {
    name: Field(("hang-json", "hang-pickle"), change, INT_VALUES, name, bounds) for name, change, bounds in (
        ("record_id", _last_entry("record_id"), NONNEG),
        ("pg_id", _last_entry("pg_id"), NONNEG),
        ("collective_seq_id", _last_entry("collective_seq_id"), NONNEG),
        ("p2p_seq_id", _last_entry("p2p_seq_id"), NONNEG),
        ("time_created_ns", _last_entry("time_created_ns"), NONNEG),
        ("time_discovered_started_ns", _last_entry("time_discovered_started_ns"), NONNEG),
        ("time_discovered_completed_ns", _last_entry("time_discovered_completed_ns"), NONNEG),
        ("timeout_ms", _last_entry("timeout_ms"), NONNEG),
        ("input_sizes", _size_dim, NONNEG),
        ("ranks", _pg_config_ranks, WORLD_RANK),
        ("last_completed_collective", _pg_status("last_completed_collective"), (-1, 2**63 - 1)),
        ("last_enqueued_collective", _pg_status("last_enqueued_collective"), (-1, 2**63 - 1)))}
DUMP_RANK_NAMES = (10**20, 2**63, 2**18)  # a dump's rank is its file name's number


def _first_step_of_rank(doc, value):
    doc["ranks"][0]["steps"][0]["step"] = value


RESULT_FIELDS: dict[str, Field] = {
    name: Field(("result",), change, values, None, None) for name, change, values in (
        ("job.world_size", _set_path("job", "world_size"), INT_VALUES),
        ("ranks[0].rank", _set_path("ranks", 0, "rank"), INT_VALUES),
        ("ranks[0].world_size", _set_path("ranks", 0, "world_size"), INT_VALUES),
        ("ranks[0].steps[0].step", _first_step_of_rank, INT_VALUES),
        ("ranks[0].step_time_us", _set_path("ranks", 0, "step_time_us"), INT_VALUES + FLOAT_VALUES),
        ("collectives[0].rank", _set_path("collectives", 0, "rank"), INT_VALUES),
        ("collectives[0].bytes", _set_path("collectives", 0, "bytes"), INT_VALUES + FLOAT_VALUES),
        ("collectives[0].in_nelems", _set_path("collectives", 0, "in_nelems"), INT_VALUES),
        ("collectives[0].step", _set_path("collectives", 0, "step"), INT_VALUES),
        ("collectives[0].dur_us", _set_path("collectives", 0, "dur_us"), INT_VALUES + FLOAT_VALUES),
        ("collectives[0].group.size", _set_path("collectives", 0, "group", "size"), INT_VALUES),
        ("collectives[0].group.ranks", _set_path("collectives", 0, "group", "ranks"), INT_VALUES),
        ("buckets[0].bytes", _set_path("buckets", 0, "bytes"), INT_VALUES + FLOAT_VALUES),
        ("buckets[0].step", _set_path("buckets", 0, "step"), INT_VALUES),
        ("job.gpu_mem_bytes", _set_path("job", "gpu_mem_bytes"), INT_VALUES))}


# -- the base jobs -------------------------------------------------------------------------------

# Two ranks of a sample job each (files: rank 0 first, the one changed).
JOBS = {
    "ddp": (SAMPLES / "synthetic" / "ddp_bucket_oversized", ("rank-0.json.gz", "rank-1.json.gz")),
    "fsdp": (SAMPLES / "synthetic" / "fsdp2_per_layer_healthy", ("rank-0.json.gz", "rank-1.json.gz")),
    "gloo": (SAMPLES / "cpu_gloo" / "ddp", ("rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz")),
    "memory": (SAMPLES / "cpu_gloo" / "memory_ddp", ("rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz")),
    "pp": (SAMPLES / "synthetic" / "pp_gpipe_4stage", ("rank-0.json.gz", "rank-1.json.gz")),
    "hang-json": (SAMPLES / "flight_recorder" / "skip_collective" / "json",
                  tuple(f"fr_rank_{r}.json" for r in range(4))),
    "hang-pickle": (SAMPLES / "flight_recorder" / "skip_collective" / "pickle", tuple(f"fr_rank_{r}" for r in range(4))),
}


def _raw(job: str) -> bytes:
    """Rank 0's file, inflated (a case's copy is written plain: reading one back is the cheapest
    way to a fresh copy, and plain files are the fastest to write)."""
    src, files = JOBS[job]
    raw = (src / files[0]).read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _fresh(job: str, raw: bytes) -> Any:
    return pickle.loads(raw) if job == "hang-pickle" else msgspec.json.decode(raw)  # 5x json's speed


def _write(job: str, doc: Any, path: Path) -> None:
    path.write_bytes(pickle.dumps(doc) if job == "hang-pickle" else msgspec.json.encode(doc))


def _label(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= 2**20:
        exponent = abs(value).bit_length() - 1
        return f"{'-' if value < 0 else ''}2e{exponent}" if abs(value) == 2**exponent else f"{value:.3g}"
    return str(value)


def _level(value: Any, field: Field) -> int:
    """Which runs take this value (``Case.level``)."""
    if value in FEW:
        return 0
    if value in CI_ALSO or value not in INT_VALUES or (field.bounds and field.bounds[1] >= PAST_I64):
        return 1
    return 2


def _directory(root: Path, name: str) -> Path:
    directory = root / "".join(c if c.isalnum() else "_" for c in name)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def unchanged_cases(root: Path) -> list[Case]:
    """Each base job as it is: the reference for time (and a saved result of the DDP job)."""
    cases = []
    for job, (src, files) in JOBS.items():
        directory = _directory(root, f"{job}/unchanged")
        for f in files:
            shutil.copyfile(src / f, directory / f)
        cases.append(Case(f"{job}/unchanged", job, None, False, directory))
    saved = _directory(root, "result/unchanged") / "result.json"
    saved.write_text(run_cli(["diagnose", str(cases[0].path), "--no-cache", "--workers", "1", "--format", "json"]).out)
    return cases + [Case("result/unchanged", "result", None, False, saved)]


def cases(root: Path, only: str = "", every: bool = True) -> list[Case]:
    """Write every case under ``root`` (a directory each; without ``every``, CI's share) and
    return them, the unchanged jobs first."""
    out = unchanged_cases(root)
    raws = {job: _raw(job) for job in JOBS}
    raws["result"] = out[-1].path.read_bytes()
    for label, field in {**TRACE_FIELDS, **DUMP_FIELDS, **RESULT_FIELDS}.items():
        for job in field.jobs:
            for value in field.values:
                name = f"{job}/{label}={_label(value)}"
                if only not in name or not (every or _level(value, field) < 2):
                    continue
                directory = _directory(root, name)
                doc = _fresh(job, raws[job])
                field.change(doc, value)
                if job == "result":
                    target = directory / "result.json"
                    target.write_text(json.dumps(doc))
                else:
                    src, files = JOBS[job]
                    for f in files[1:]:
                        shutil.copyfile(src / f, directory / f)
                    target = directory
                    _write(job, doc, directory / files[0].removesuffix(".gz"))
                outside = field.bounds is not None and not field.bounds[0] <= value <= field.bounds[1]
                out.append(Case(name, job, field.says, outside, target, _level(value, field)))
    for job in ("hang-json", "hang-pickle"):
        src, files = JOBS[job]
        for number in DUMP_RANK_NAMES:
            name = f"{job}/file name rank={_label(number)}"
            if only in name:
                directory = _directory(root, name)
                for f in files[:-1]:
                    shutil.copyfile(src / f, directory / f)
                renamed = re.sub(r"\d+(?=(\.json)?$)", str(number), files[-1])  # fr_rank_3[.json] -> fr_rank_N
                shutil.copyfile(src / files[-1], directory / renamed)
                out.append(Case(name, job, "rank", True, directory))
    return out


# -- running -------------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float  # wall
    cpu_seconds: float  # this process's CPU: what the run cost, whatever else the machine runs


def run_cli(argv: list[str]) -> Outcome:
    """``tracecliff ARGV`` in this process: exit code, stdout, stderr and wall time."""
    from analyzer.cli.main import main

    out, err = io.BytesIO(), io.StringIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    stdout.flush()
    return Outcome(code, out.getvalue().decode("utf-8", "replace"), err.getvalue(), seconds, cpu)


def commands(case: Case, every: bool = False) -> dict[str, list[str]]:
    """The commands a case runs: hang on dumps; diagnose (JSON; a saved result also as text and
    HTML), gate and whatif on traces and results; in CI (not ``every``) as ``case.level`` says."""
    d = str(case.path)
    level = 0 if every else case.level
    if level == 2:
        return {}
    if case.job.startswith("hang"):
        return {"hang": ["hang", d, "--format", "json"]}
    common = [] if case.job == "result" else ["--no-cache", "--workers", "1"]
    out = {"diagnose": ["diagnose", d, *common, "--format", "json"]}
    if case.job == "result":
        out.update(text=["diagnose", d], html=["diagnose", d, "--format", "html"])
    if level == 0:
        out.update(gate=["gate", d, *common, "--preset", "recommended", "--format", "json"],
                   whatif=["whatif", d, *common, "--gpus", "64", "--format", "json"])
    return out


def warnings_of(outcome: Outcome) -> list[str]:
    """What a clean run said: its JSON's warnings (diagnose, gate, whatif; hang's notes too)
    and stderr's lines."""
    found = [line for line in outcome.err.splitlines() if line.strip()]
    try:
        doc = json.loads(outcome.out)
    except ValueError:
        return found + outcome.out.splitlines()  # text: its "warning:" lines
    if isinstance(doc, dict):
        found += [w for key in ("warnings", "notes") for w in doc.get(key) or [] if isinstance(w, str)]
    return found


def verdict(case: Case, outcome: Outcome) -> str | None:
    """None when the run exited cleanly, else what is wrong. Clean: 0/1 (with a warning
    containing ``case.says`` when the value must be said), or 2 with one line; never a
    traceback or an internal error."""
    err = outcome.err
    if "Traceback" in err or "internal error" in err:
        return f"crashed: {err.strip().splitlines()[-1][:300] if err.strip() else '?'}"
    if outcome.code == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("tracecliff: "):
            return f"exit 2 without one line: {err[:300]!r}"
        return None
    if outcome.code not in (0, 1):
        return f"exit {outcome.code}: {err[:300]!r}"
    if case.must_say and case.says and not any(case.says in w for w in warnings_of(outcome)):
        return f"exit {outcome.code} without a warning naming {case.says!r}"
    return None


def run_all(root: Path, report: Path, every: bool = False, only: str = "") -> None:
    """Every case's commands in this process (``--workers 1``: the per-rank work too); ``report``
    gets one JSON row per run (name, job, command, exit code, wall and CPU seconds, verdict).
    The unchanged jobs run twice (the first run pays the imports): their second run is the
    reference. Each run starts after a full garbage collection, untimed: the garbage earlier runs
    left (a Result and its model refer to each other) is otherwise collected by whichever later
    run crosses the collector's threshold, and charged to it (0.5 s of CPU at the ~1,200th run of
    the long one, against 0.01 s of its own)."""
    rows = []
    for case in cases(root, only, every):
        for command, args in commands(case, every).items():
            if case.name.endswith("/unchanged"):
                run_cli(args)
            gc.collect()
            outcome = run_cli(args)
            rows.append({"name": case.name, "job": case.job, "command": command, "code": outcome.code,
                         "seconds": outcome.seconds, "cpu_seconds": outcome.cpu_seconds,
                         "verdict": verdict(case, outcome),
                         "said": next((w for w in warnings_of(outcome) if case.says and case.says in w), None)
                         if outcome.code != 2 else outcome.err.strip()})
            report.write_text(json.dumps(rows))  # what ran so far survives a kill


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    report = root / "report.json"
    run_all(root, report, every=True, only=only)
    for row in json.loads(report.read_text()):
        print(f"{'FAIL' if row['verdict'] else 'ok  '} {row['name']:55s} {row['command']:8s} rc={row['code']} "
              f"{row['seconds']:6.2f}s  {(row['verdict'] or row['said'] or '-')[:220]}")


if __name__ == "__main__":
    main(sys.argv[1:])
