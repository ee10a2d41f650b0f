"""tracecliff hang on hostile input: a pickle that would run code is refused (and nothing runs);
fuzzed JSON dumps give a report or a one-line error, never a traceback."""

from __future__ import annotations

import copy
import json
import os
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.cli import main
from analyzer.base.errors import InputError
from analyzer.hang import triage
from analyzer.reports.hang_html import render_html
from analyzer.reports.hang_text import render_text
from analyzer.synth import flight_recorder as fr
from hang_dumps import NCCL, SAMPLES

EXAMPLES = int(os.environ.get("TRACECLIFF_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXAMPLES or 120, deadline=None, derandomize=EXAMPLES == 0,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class _RunsCode:
    """Unpickled normally, this creates the marker file (os.system would do anything)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("where", ["top", "entry"])
def test_code_running_pickle_is_refused_and_nothing_runs(tmp_path, capsys, where):
    marker = tmp_path / "pwned"
    doc = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    if where == "top":
        doc = _RunsCode(str(marker))
    else:
        doc["entries"].append({"profiling_name": _RunsCode(str(marker))})
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(doc))
    with pytest.raises(SystemExit) as exit_info:
        main(["hang", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert str(path) in err and "refused to load posix.mkdir" in err
    assert not marker.exists()
    pickle.loads(path.read_bytes())  # the control: an ordinary unpickle of the same file runs it
    assert marker.exists()


@pytest.mark.parametrize("raw, problem", [
    (b"\x80\x04\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94\x8c\x011\x94\x85\x94R\x94.",
     "refused to load builtins.eval"),                      # STACK_GLOBAL + REDUCE
    (b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.", "refused to load os.system"),
    (b"\x80\x02\x82\x01.", "pickle"),                       # EXT1: the copyreg extension registry
    (b"\x80\x05\x97.", "pickle"),                            # NEXT_BUFFER: an out-of-band buffer
    (b"\x80\x05\x96\x03\x00\x00\x00\x00\x00\x00\x00abc.", "pickle holds a bytearray, not plain data"),
    (b"\x80\x02P1\n.", "refused a persistent id"),            # PERSID: the unpickler's persistent_load
])
def test_opcodes_that_could_run_or_smuggle_objects_are_refused(tmp_path, raw, problem):
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(raw)
    with pytest.raises(InputError) as caught:
        triage([str(path)])
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_code_running_pickle_found_in_a_folder_is_refused_too(tmp_path):
    marker = tmp_path / "pwned"
    job = tmp_path / "job" / "pickle"
    job.mkdir(parents=True)
    (job / "fr_rank_0").write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(InputError, match="refused to load posix.mkdir"):
        triage([str(tmp_path / "job")])
    assert not marker.exists()


def test_real_pickles_need_no_global():
    # the committed torch 2.13 dumps load through the restricted unpickler
    assert triage([str(SAMPLES / "healthy" / "pickle")]).hangs == []


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                     | st.text(max_size=12), lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
BASE = json.loads((SAMPLES / "skip_collective" / "json" / "fr_rank_0.json").read_text())
PATHS = [("version",), ("pg_config",), ("pg_status",), ("pg_status", "0"), ("pg_status", "0", "last_completed_collective"),
         ("entries",), ("entries", 0), *[("entries", 0, k) for k in BASE["entries"][0]], ("entries", 3, "process_group", 0),
         ("pg_config", "", "ranks")]


def _mutate(doc, path, value, delete):
    target = doc
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), _JSON, st.booleans()), min_size=1, max_size=4),
       rank=st.sampled_from([0, 1, 2, 3]))
def test_fuzzed_json_dumps_never_traceback(tmp_path_factory, edits, rank):
    job = tmp_path_factory.mktemp("fuzz")
    for r in range(4):
        (job / f"fr_rank_{r}.json").write_bytes((SAMPLES / "skip_collective" / "json" / f"fr_rank_{r}.json").read_bytes())
    doc = copy.deepcopy(BASE)
    for path, value, delete in edits:
        try:
            _mutate(doc, path, value, delete)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed the parent
    (job / f"fr_rank_{rank}.json").write_text(json.dumps(doc))
    try:
        report = triage([str(job)])
    except InputError as exc:
        assert "\n" not in str(exc) and f"fr_rank_{rank}.json" in str(exc)
        return
    report.to_dict()
    from analyzer.reports.hang_html import render_html
    from analyzer.reports.hang_text import render_text
    render_text(report.to_dict())
    render_html(report.to_dict())


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes_never_traceback(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "nccl_trace_rank_0"
    path.write_bytes(b"\x80" + data)
    try:
        triage([str(path)])
    except InputError as exc:
        assert "\n" not in str(exc)


def _fuzz_job(tmp_path_factory, source, name, doc, edits):
    job = tmp_path_factory.mktemp("fuzz")
    for f in source.iterdir():
        if f.is_file():
            (job / f.name).write_bytes(f.read_bytes())
    for path, value, delete in edits:
        try:
            _mutate(doc, path, value, delete)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed the parent
    (job / name).write_text(json.dumps(doc))
    return job


def _triage_renders_or_one_line(job, name):
    try:
        report = triage([str(job)])
    except InputError as exc:
        assert "\n" not in str(exc) and name in str(exc)
        return
    render_text(report.to_dict())
    render_html(report.to_dict())


PAIRED = json.loads((SAMPLES / "status_lag" / "fr_rank_0.json").read_text())
PAIRED_PATHS = [("entries", 4, k) for k in PAIRED["entries"][4]] + [("entries", 0), ("pg_status", "0"), ("version",),
                                                                   ("pg_config", "", "ranks"), ("entries",)]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PAIRED_PATHS), _JSON, st.booleans()), min_size=1, max_size=4))
def test_fuzzed_json_beside_its_pickle_never_tracebacks(tmp_path_factory, edits):
    """The JSON of a rank whose pickle is in the same folder: the pair is compared."""
    job = _fuzz_job(tmp_path_factory, SAMPLES / "status_lag", "fr_rank_0.json", copy.deepcopy(PAIRED), edits)
    _triage_renders_or_one_line(job, "fr_rank_0")


NCCL_JSON = json.loads((NCCL / "nccl_coalesced_p2p" / "nccl_trace_rank_0.json").read_text())
NCCL_PATHS = [("entries", i, k) for i in (3, 5, 6, 7) for k in NCCL_JSON["entries"][i]] + [
    ("pg_status", "0", "last_completed_collective"), ("pg_config", "3", "ranks"), ("pg_config",), ("comm_lib_version",)]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(NCCL_PATHS), _JSON, st.booleans()), min_size=1, max_size=4))
def test_fuzzed_nccl_json_dumps_never_traceback(tmp_path_factory, edits):
    """Format 2.10 with a coalesced block, a p2p batch and its marker."""
    folder = tmp_path_factory.mktemp("src")
    fr.write_scenario("nccl_coalesced_p2p", folder, formats=("json",))
    job = _fuzz_job(tmp_path_factory, folder, "nccl_trace_rank_0.json", copy.deepcopy(NCCL_JSON), edits)
    _triage_renders_or_one_line(job, "nccl_trace_rank_0.json")


OLD = pickle.loads((NCCL / "nccl_silent_highest" / "nccl_trace_rank_0").read_bytes())  # our own: plain data
OLD_PATHS = [("entries", 2, k) for k in OLD["entries"][2]] + [("pg_config", 0), ("pg_config",), ("entries", 0)]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(OLD_PATHS), _JSON | st.tuples(st.integers(), st.text(max_size=3)),
                                st.booleans()), min_size=1, max_size=4))
def test_fuzzed_format_1_4_pickles_never_traceback(tmp_path_factory, edits):
    """Format 1.4 (pg_config by pg_id, one seq_id), pickled, through the restricted unpickler."""
    job = tmp_path_factory.mktemp("old")
    for f in (NCCL / "nccl_silent_highest").iterdir():
        (job / f.name).write_bytes(f.read_bytes())
    doc = copy.deepcopy(OLD)
    for path, value, delete in edits:
        try:
            _mutate(doc, path, value, delete)
        except (KeyError, IndexError, TypeError):
            pass
    (job / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc))
    try:
        report = triage([str(job)])
    except InputError as exc:
        assert "\n" not in str(exc) and "nccl_trace_rank_0" in str(exc)
        return
    render_text(report.to_dict())
