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
from hang_dumps import SAMPLES

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
