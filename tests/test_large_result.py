"""A large result (more than JSON_ROWS collective rows, analyzer.job.large) saved as two files:
the JSON (schema_version 3) and its rows file (Parquet). Every view of it (text, HTML, gate,
diff, load_result, the what-if) gives the fresh run's figures; the views need no rows file;
the rows come back exactly; a missing or hostile rows file is one line naming it (exit 2).

JSON_ROWS is lowered here so that small sample jobs are "large": the same code paths as a
1,024-rank job's (bench/bench_reduce.py measures those)."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import sys
from pathlib import Path

import msgspec
import pytest

from analyzer.api import DiagnoseOptions, diagnose, diff, gate, load_result
from analyzer.base.errors import InputError
from analyzer.job import large, rows_file
from analyzer.job.result import Result
from analyzer.reports import render
from rule_cases_lib import sample_traces
from test_cache_entry import _same  # equal type for type, NaN equal to NaN, key order included
from test_gate import run_cli

pytest.importorskip("pyarrow")

LIMIT = 100  # JSON_ROWS here


@pytest.fixture()
def small_limit(monkeypatch):
    monkeypatch.setattr(large, "JSON_ROWS", LIMIT)


def _diagnosed(job: str = "synthetic/ddp_straggler") -> Result:
    return diagnose(sample_traces()[job], DiagnoseOptions(workers=1))


def _saved(tmp_path, job: str = "synthetic/ddp_straggler") -> tuple[Result, object]:
    result = _diagnosed(job)
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "result.json"
    assert result.save(path).file == "result.collectives.parquet"
    return result, path


def test_a_large_result_is_two_files_and_says_what_it_left_out(small_limit, tmp_path):
    result, path = _saved(tmp_path)
    doc = json.loads(path.read_text())
    section = doc["collective_rows"]
    count = len(result.collectives)
    assert doc["schema_version"] == 3 and "buckets" not in doc and "fsdp_units" not in doc
    assert section["count"] == count and section["in_json"] == LIMIT == len(doc["collectives"])
    assert section["left_out"] == count - LIMIT and section["chosen_by"] == "exposed_us"
    assert section["buckets"] == len(result.buckets) > 0
    assert section["sha256"] == rows_file.sha256(tmp_path / "result.collectives.parquet")
    # the JSON holds the most exposed rows (ties: rank, start), in row order
    key = lambda r: (-(r["exposed_us"] if r["exposed_us"] is not None else -math.inf), r["rank"], r["start_us"])  # noqa: E731
    ranked = sorted(range(count), key=lambda i: key(result.collectives[i]))
    chosen = sorted(ranked[:LIMIT])
    assert doc["collectives"] == [json.loads(json.dumps(result.collectives[i])) for i in chosen]
    assert all("step_columns" in r and "steps" not in r for r in doc["ranks"])
    assert path.read_bytes() == result.to_json(large.RowsWritten(section["file"], section["sha256"])).encode()


@pytest.mark.parametrize("job", ["synthetic/ddp_straggler", "synthetic/fsdp_hybrid_2node", "cpu_gloo/fsdp2_tp"])
def test_every_view_of_a_saved_large_result_is_the_fresh_runs(small_limit, tmp_path, job):
    result, path = _saved(tmp_path, job)
    again = load_result(path)
    for fmt in ("html", "text"):
        assert render(again, fmt) == render(result, fmt), fmt
    # the rows, the DDP buckets and FSDP units come back from the rows file
    assert again.collectives == result.collectives
    assert again.buckets == result.buckets and again.fsdp_units == result.fsdp_units
    assert again.collective_count == len(result.collectives)
    import pandas as pd
    pd.testing.assert_frame_equal(again.collectives_df(), result.collectives_df())


def test_gate_diff_and_the_what_if_read_a_large_result_as_a_small_one(small_limit, tmp_path, monkeypatch, capsys):
    """The same job saved large (rows file) and small (schema_version 1, every row in the JSON),
    each as result.json in a folder of its own: gate, diff and what-if give the same bytes."""
    traces = sample_traces()["synthetic/ddp_straggler"]
    folder = str(Path(traces[0]).parent)
    _saved(tmp_path / "big")
    monkeypatch.setattr(large, "JSON_ROWS", 10**9)
    (tmp_path / "small").mkdir()
    _diagnosed().save(tmp_path / "small" / "result.json")
    assert json.loads((tmp_path / "small" / "result.json").read_text())["schema_version"] == 1
    config = {"gate": {"assertions": {"exposed_comm_pct": ["error", {"max": 90}],
                                      "busbw_gbps:default_pg": ["warn", {"min": 1, "aggregate": "p90"}]}}}
    outputs = {}
    for side in ("big", "small"):
        monkeypatch.chdir(tmp_path / side)
        assert run_cli(["whatif", "result.json", "--format", "json", "-o", "whatif.json"], capsys)[0] == 0
        outputs[side] = (gate(traces, config, baseline="result.json")[0].to_dict(), diff("result.json", folder)[0],
                         diff(folder, "result.json")[0], (tmp_path / side / "whatif.json").read_bytes())
    assert outputs["big"] == outputs["small"]


def test_the_views_need_no_rows_file(small_limit, tmp_path, capsys):
    result, path = _saved(tmp_path)
    html = render(result, "html")
    (tmp_path / "result.collectives.parquet").unlink()
    again = load_result(path)
    assert render(again, "html") == html and render(again, "text") == render(result, "text")
    rc, _, err = run_cli(["diagnose", path, "--format", "html", "-o", tmp_path / "again.html"], capsys)
    assert rc == 0 and (tmp_path / "again.html").read_text() == html, err
    assert run_cli(["gate", path, "--baseline", path, "--preset", "recommended"], capsys)[0] == 0
    assert run_cli(["diff", path, path], capsys)[0] == 0
    # the rows themselves: one line naming the file, exit 2
    with pytest.raises(InputError, match=r"result\.collectives\.parquet: the rows file of .* is not there"):
        _ = again.collectives
    rc, out, err = run_cli(["whatif", path], capsys)
    assert rc == 2 and err.count("\n") == 1 and "result.collectives.parquet" in err, err


def test_load_result_reads_no_rows(small_limit, tmp_path, monkeypatch):
    _, path = _saved(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("the rows file was read")
    monkeypatch.setattr(rows_file, "read", refuse)
    monkeypatch.setattr(rows_file, "sha256", refuse)
    again = load_result(path)
    _ = render(again, "html"), render(again, "text"), repr(again)
    gate(str(path), {}, baseline=str(path), preset="recommended")
    with pytest.raises(AssertionError, match="was read"):
        _ = again.collectives


def test_a_resaved_large_result_takes_its_rows_file_along(small_limit, tmp_path, capsys):
    _, path = _saved(tmp_path)
    other = tmp_path / "copy" / "other.json"
    other.parent.mkdir()
    assert run_cli(["diagnose", path, "--format", "json", "-o", other], capsys)[0] == 0
    assert (other.parent / "other.collectives.parquet").read_bytes() == (tmp_path / "result.collectives.parquet").read_bytes()
    assert other.read_text() == path.read_text().replace('"result.collectives.parquet"', '"other.collectives.parquet"')
    assert load_result(other).collectives == load_result(path).collectives


def test_the_cli_writes_the_rows_file_beside_the_json(small_limit, tmp_path, capsys):
    out = tmp_path / "out.json"
    rc, _, err = run_cli(["diagnose", *sample_traces()["synthetic/ddp_straggler"], "--no-cache", "--workers", "1",
                          "--format", "json", "-o", out], capsys)
    assert rc == 0 and err == "" and (tmp_path / "out.collectives.parquet").is_file()
    rc, out_text, err = run_cli(["diagnose", *sample_traces()["synthetic/ddp_straggler"], "--no-cache", "--workers", "1",
                                 "--format", "json"], capsys)
    assert rc == 0 and "the collective rows beyond the JSON's are not written" in err
    assert json.loads(out_text)["collective_rows"]["file"] is None


def test_without_pyarrow_the_json_stands_alone_and_says_why(small_limit, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rows_file, "available", lambda: False)
    result = _diagnosed()
    path = tmp_path / "result.json"
    written = result.save(path)
    assert written.file is None and "tracecliff[parquet]" in written.why
    assert not (tmp_path / "result.collectives.parquet").exists()
    again = load_result(path)
    assert render(again, "html") == render(result, "html")
    with pytest.raises(InputError, match=r"pyarrow is not installed"):
        _ = again.collectives
    # reading a rows file without pyarrow: one line saying what to install
    monkeypatch.undo()
    monkeypatch.setattr(large, "JSON_ROWS", LIMIT)
    _, path = _saved(tmp_path / "with")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(InputError, match=r"needs pyarrow: pip install 'tracecliff\[parquet\]'"):
        _ = load_result(path).collectives


# ---------------------------------------------------------------- the rows file itself
def test_rows_come_back_exactly(tmp_path):
    group = {"name": "0", "size": 2, "ranks": [0, 1], "description": "default_pg"}
    rows = [
        {"rank": 0, "start_us": 1.5, "bytes": 2**62, "comms_id": 2**63 + 5, "seq": -3, "huge": 2**70, "on_gpu": True,
         "kind": "allreduce", "none": None, "nan": float("nan"), "inf": float("-inf"), "mixed": 1, "list": [1, [2.5]],
         "dict": {"a": None}, "group": group, "flag": None, "text": "é\n\"x"},
        {"rank": 1, "start_us": float("nan"), "bytes": None, "comms_id": None, "seq": None, "huge": None, "on_gpu": False,
         "kind": None, "none": None, "nan": 2.0, "inf": 0.5, "mixed": 2.5, "list": None, "dict": {}, "group": group,
         "flag": False, "extra": "only here", "text": ""},
        {"rank": 2, "start_us": -0.0, "bytes": 0, "seq": 7, "on_gpu": True, "kind": "allgather", "nan": None,
         "mixed": None, "group": {"name": None, "size": None}, "flag": True, "text": None},
    ]
    path = tmp_path / "rows.parquet"
    sha = rows_file.write(path, rows)
    assert sha == rows_file.sha256(path)
    back = rows_file.read(path, len(rows))
    for written, read in zip(rows, back):
        assert _same({k: written[k] for k in sorted(written)}, read), (written, read)
    assert rows_file.write(tmp_path / "again.parquet", rows) == sha  # same rows, same bytes


def test_rows_of_a_diagnosed_job_come_back_exactly(tmp_path):
    """The writer takes most columns from the job's columns (analyzer.job.columns): the same values."""
    result = _diagnosed("synthetic/fsdp_hybrid_2node")
    from analyzer.job.columns import CollectiveColumns
    path = tmp_path / "rows.parquet"
    rows_file.write(path, result.collectives, CollectiveColumns.of(result))
    back = rows_file.read(path, len(result.collectives))
    assert all(_same({k: w[k] for k in sorted(w)}, r) for w, r in zip(result.collectives, back))


# ---------------------------------------------------------------- hostile rows files
def _reseal(path, rows_path) -> None:
    """Make the JSON name the (replaced) rows file's digest, as a hand-made pair would."""
    doc = json.loads(path.read_text())
    doc["collective_rows"]["sha256"] = rows_file.sha256(rows_path)
    path.write_text(json.dumps(doc))


def _table(path):
    import pyarrow.parquet as pq
    return pq.read_table(path)


def _write(table, path):
    import pyarrow.parquet as pq
    pq.write_table(table, path)


def _truncated(rows_path, path):
    rows_path.write_bytes(rows_path.read_bytes()[:-100])


def _another_runs(rows_path, path):
    rows_file.write(rows_path, [{"rank": 0}])


def _not_parquet(rows_path, path):
    rows_path.write_bytes(b"PAR1 not really" * 10)
    _reseal(path, rows_path)


def _no_description(rows_path, path):
    _write(_table(rows_path).replace_schema_metadata({}), rows_path)
    _reseal(path, rows_path)


def _wrong_column_type(rows_path, path):
    import pyarrow as pa
    table = _table(rows_path)
    index = table.column_names.index("dur_us")
    table = table.set_column(index, "dur_us", pa.array([str(v) for v in table.column("dur_us").to_pylist()]))
    _write(table, rows_path)
    _reseal(path, rows_path)


def _wrong_count(rows_path, path):
    table = _table(rows_path)
    _write(table.slice(0, 10).replace_schema_metadata(table.schema.metadata), rows_path)
    _reseal(path, rows_path)


def _code_out_of_range(rows_path, path):
    import pyarrow as pa
    table = _table(rows_path)
    index = table.column_names.index("group_code")
    table = table.set_column(index, "group_code", pa.array([99] * table.num_rows, type=pa.int32()))
    _write(table, rows_path)
    _reseal(path, rows_path)


def _garbled_description(rows_path, path):
    table = _table(rows_path)
    _write(table.replace_schema_metadata({b"tracecliff": b'{"format": 1, "rows": "many"}'}), rows_path)
    _reseal(path, rows_path)


class _Payload:
    """Unpickling this would write a file: a reader that unpickles anything is caught."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickled_extension_type(rows_path, path):
    """A column whose type claims to be a pickled Python extension type (what old pyarrow
    unpickled on reading): it must be refused, never unpickled."""
    import pyarrow as pa
    table = _table(rows_path)
    marker = rows_path.with_name("unpickled")
    field = table.schema.field("dur_us").with_metadata({b"ARROW:extension:name": b"arrow.py_extension_type",
                                                         b"ARROW:extension:metadata": pickle.dumps(_Payload(str(marker)))})
    schema = table.schema.set(table.schema.get_field_index("dur_us"), field)
    _write(pa.Table.from_arrays(table.columns, schema=schema), rows_path)
    _reseal(path, rows_path)


@pytest.mark.parametrize("damage, message", [
    (_truncated, "not the rows file of"), (_another_runs, "not the rows file of"),
    (_not_parquet, "not a readable Parquet rows file"), (_no_description, "not a tracecliff rows file"),
    (_wrong_column_type, "column 'dur_us'"), (_wrong_count, "holds 10 rows"),
    (_code_out_of_range, "out of range"), (_garbled_description, "damaged rows file description"),
])
def test_a_hostile_rows_file_is_one_line_naming_it(small_limit, tmp_path, capsys, damage, message):
    _, path = _saved(tmp_path)
    rows_path = tmp_path / "result.collectives.parquet"
    damage(rows_path, path)
    with pytest.raises(InputError, match=message) as error:
        _ = load_result(path).collectives
    assert str(rows_path) in str(error.value) and "\n" not in str(error.value)
    rc, out, err = run_cli(["whatif", path], capsys)
    assert rc == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_a_rows_file_is_never_unpickled(small_limit, tmp_path):
    """A column typed as a pickled Python extension type (what pyarrow before 14.0.1 unpickled
    on reading): its payload never runs; the values are read as the storage they are, or refused."""
    result, path = _saved(tmp_path)
    rows_path = tmp_path / "result.collectives.parquet"
    _pickled_extension_type(rows_path, path)
    try:
        assert load_result(path).collectives == result.collectives
    except InputError as error:
        assert str(rows_path) in str(error)
    assert not rows_path.with_name("unpickled").exists()


def test_a_hostile_json_cannot_point_outside_its_folder(small_limit, tmp_path, capsys):
    _, path = _saved(tmp_path)
    doc = json.loads(path.read_text())
    doc["collective_rows"]["file"] = "../elsewhere.parquet"
    path.write_text(json.dumps(doc))
    rc, _, err = run_cli(["diagnose", path], capsys)
    assert rc == 2 and "collective_rows.file" in err, err


def test_a_result_of_another_version_is_one_line(tmp_path, capsys):
    doc = json.loads(_diagnosed().to_json())
    doc["schema_version"] = 4
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    rc, _, err = run_cli(["diagnose", path], capsys)
    assert rc == 2 and "schema_version 4 is not one this tracecliff reads (it reads 1 and 3)" in err
    doc["schema_version"] = 2  # the first large results: their digest's busbw had another definition
    path.write_text(json.dumps(doc))
    rc, _, err = run_cli(["diagnose", path], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "schema_version 2 (a large result of an earlier tracecliff" in err and "it reads 1 and 3" in err


def test_steps_by_column_read_back_as_steps(small_limit, tmp_path):
    result, path = _saved(tmp_path, "synthetic/fsdp_hybrid_2node")
    doc = json.loads(path.read_text())
    for entry, rank in zip(doc["ranks"], result.ranks):
        steps = large.steps_of(entry["step_columns"], "x")
        expected = json.loads(json.dumps(rank.steps))
        for step in expected:
            (step.get("time_breakdown") or {}).pop("idle_queued_ops", None)  # the typical step's only
        assert steps == expected and all(list(s) == sorted(s) for s in steps)


def test_a_large_document_validates_against_the_published_schema(small_limit, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from analyzer.api import result_schema
    from analyzer.job.schema import AnyResultDocument, LargeResultDocument
    _, path = _saved(tmp_path)
    doc = json.loads(path.read_text())
    assert list(jsonschema.Draft202012Validator(result_schema()).iter_errors(doc)) == []
    assert isinstance(msgspec.json.decode(path.read_bytes(), type=AnyResultDocument), LargeResultDocument)


def test_the_dask_and_local_large_results_are_the_same_bytes(small_limit, tmp_path):
    """Saved from runs of either executor: the same JSON and rows file (tests/test_dask_cluster.py
    checks a real cluster)."""
    pytest.importorskip("distributed")
    traces = sample_traces()["synthetic/ddp_straggler"]
    for name, options in (("local", DiagnoseOptions(workers=1)), ("dask", DiagnoseOptions(executor="dask", workers=2))):
        (tmp_path / name).mkdir()
        diagnose(traces, options).save(tmp_path / name / "result.json")
    for file in ("result.json", "result.collectives.parquet"):
        assert (tmp_path / "local" / file).read_bytes() == (tmp_path / "dask" / file).read_bytes()
    shutil.rmtree(tmp_path / "dask")
