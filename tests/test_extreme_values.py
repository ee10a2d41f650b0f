"""Issue 30's guard: one number in an input must not take the machine down. ``diagnose``, ``gate``,
``whatif`` and ``hang`` run on inputs with an extreme value in every numeric field the readers
accept (tests/extreme_inputs.py: each field of a sample trace, a Flight Recorder dump and a
saved result set to values beyond int64 and uint64, past any device's memory or any world,
negative), in one child process under a memory limit (RLIMIT_AS) and a time limit. Each run
exits cleanly (0/1, with a warning naming the field when its value is beyond what it can hold;
or 2 with one line; never a traceback or an internal error), in about the time of the
unchanged input: cost follows the input's size, never its values.

CI runs gate and whatif on a few values of each field (diagnose and hang on all); with
``TRACECLIFF_FUZZ_EXAMPLES`` set (the documented long run) every command runs on every value.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest

import extreme_inputs
from analyzer.ingest import schema

HERE = Path(__file__).resolve().parent
MEMORY_LIMIT = 3 << 29  # 1.5 GiB of address space for the whole run (it peaks near 150 MB)
TIME_LIMIT_S = 600  # the whole run (about a minute on two loaded cores)
EVERY = bool(os.environ.get("TRACECLIFF_FUZZ_EXAMPLES"))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("extreme")
    report = root / "report.json"
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); from pathlib import Path; import extreme_inputs; "
            f"extreme_inputs.run_all(Path({str(root)!r}), Path({str(report)!r}), every={EVERY})")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    env.pop("TRACECLIFF_DEBUG", None)
    child = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                           timeout=TIME_LIMIT_S, preexec_fn=_limit_memory)
    assert child.returncode == 0, f"the run itself failed (memory limit?): {child.stderr[-3000:]}"
    return json.loads(report.read_text())


def test_every_extreme_value_exits_cleanly(runs):
    failed = [f"{r['name']} {r['command']}: {r['verdict']}" for r in runs if r["verdict"]]
    assert not failed, f"{len(failed)} of {len(runs)} runs:\n" + "\n".join(failed[:40])
    assert len(runs) > 600  # every field of every job ran


def test_cost_follows_the_input_not_its_values(runs):
    """Each run's CPU time within a few times its unchanged input's (plus a margin for a first
    import); before issue 30 a message of 2**40 elements took 300 times as long. CPU, not wall:
    the machine may be busy with other work (its wall time is bounded loosely, for a hang)."""
    reference = {(r["job"], r["command"]): r for r in runs if r["name"].endswith("/unchanged")}
    slow = [f"{r['name']} {r['command']}: {r['cpu_seconds']:.2f} s CPU, {r['seconds']:.2f} s wall (unchanged: "
            f"{ref['cpu_seconds']:.2f} s, {ref['seconds']:.2f} s)"
            for r in runs for ref in [reference[r["job"], r["command"]]]
            if r["cpu_seconds"] > 4 * ref["cpu_seconds"] + 0.5 or r["seconds"] > 10 * ref["seconds"] + 5]
    assert not slow, "\n".join(slow)


@pytest.mark.parametrize("name, said", [
    ("ddp/In msg nelems=2e50", "args.In msg nelems (e.g. 1125899906842624): read as unknown"),
    ("ddp/In msg nelems=2e40", "larger than the device's memory (85.52 GB), e.g. args.In msg nelems 1,099,511,627,776"),
    ("ddp/distributedInfo.rank=2e70", "distributedInfo.rank 1180591620717411303424 is not a rank of this job"),
    ("ddp/ProfilerStep#=1e+20", "'ProfilerStep#100000000000000000000'): they mark no step"),
    ("ddp/distributedInfo.rank=-5", "distributedInfo.rank -5 is not a rank of this job (world size 8)"),
])
def test_the_issue_table(runs, name, said):
    """Issue 30's table, row by row: exit 0 and a warning naming the field (the file is named
    by the warning's "rank 0 (PATH): " prefix)."""
    row = next(r for r in runs if r["name"] == name and r["command"] == "diagnose")
    assert row["code"] == 0 and said in row["said"] and "rank 0 (" in row["said"], row


def _numeric_fields(struct) -> set[str]:
    """The JSON names of a schema struct's fields that may hold a number or a list of them."""
    out = set()
    for field in msgspec.structs.fields(struct):
        kinds = set(typing.get_args(field.type)) or {field.type}
        if kinds & {int, float, list} or field.type is msgspec.Raw:
            out.add(field.encode_name)
    return out


def test_every_numeric_field_the_reader_accepts_is_covered():
    """Each field of the typed Kineto schema that can hold a number is changed by some case."""
    covered = {label.split(".")[-1] for label in extreme_inputs.TRACE_FIELDS}
    numeric = set().union(*map(_numeric_fields, (schema.Event, schema.EventArgs, schema.PgConfig,
                                                 schema.DistributedInfo, schema.DeviceProperties, schema.TraceFile)))
    numeric -= {"Input type", "args", "traceEvents", "pg_config", "deviceProperties"}  # strings, containers
    # kept as raw text and parsed per distinct op by analyzer.rank.flops (the next test)
    numeric -= {"Concrete Inputs"}
    assert numeric <= covered, sorted(numeric - covered)


@pytest.mark.parametrize("value", [2**70, 10**400, -5])
def test_extreme_recorded_shapes_leave_the_op_unknown_with_the_reason(tmp_path, value):
    """A GEMM's recorded sizes (Input Dims, Concrete Inputs) beyond any tensor: the op's FLOPs
    are unknown, with the reason naming the op and its sizes, never a crash or a count from them."""
    import gzip
    import json

    from analyzer.api import diagnose
    from conftest import SAMPLES
    doc = json.load(gzip.open(SAMPLES / "gpu_h200" / "ddp" / "rank-0.pt.trace.json.gz"))
    changed = 0
    for event in doc["traceEvents"]:
        args = event.get("args") or {}
        if event.get("name") == "aten::mm" and "Input Dims" in args:
            args["Input Dims"][0][0] = value
            args["Concrete Inputs"] = [str(value)] * len(args.get("Concrete Inputs") or [1])
            changed += 1
    (tmp_path / "rank-0.json").write_text(json.dumps(doc))
    compute = diagnose([str(tmp_path / "rank-0.json")], report=False).ranks[0].compute
    assert changed and compute["unknown_ops"] >= 26
    assert all(reason.startswith("aten::mm: ") for reason in compute["unknown_reasons"])
    assert compute["flops_per_step"] < 1.5e12  # the untouched ops' count, no more
