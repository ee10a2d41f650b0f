"""Every bad input of issue 7: either one line on stderr naming the file and the problem (exit 2),
or a correct partial result whose warning shows in the text, JSON and HTML outputs."""

import gzip
import json

import pytest

from analyzer.cli.main import main
from builders import TraceBuilder, two_step_ddp

# two_step_ddp worked by hand (µs over both steps): compute = 2 x 75 (forward 30 + backward 40
# + optimizer 5); the all-reduce [60,90) is hidden 10 µs under backward: comm 60, exposed 40.
BASELINE = {"compute_us": 150.0, "comm_us": 60.0, "overlap_us": 20.0, "exposed_comm_us": 40.0,
            "span_us": 195.0, "idle_us": 5.0}


def cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(["diagnose", "--no-cache", *map(str, args)])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def expect_error(capsys, args, path, *needles):
    code, out, err = cli(capsys, *args)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    assert str(path) in err, err
    for needle in needles:
        assert needle in err, err
    return err


def outputs(capsys, *paths):
    """(JSON doc, text, html or None) of a successful run."""
    code, out, err = cli(capsys, "--format", "json", *paths)
    assert code == 0, err
    doc = json.loads(out)
    code, text, err = cli(capsys, *paths)
    assert code == 0, err
    return doc, text, _html(doc)


def _html(doc):
    try:
        from analyzer.reports.html import HtmlRenderer
    except ImportError:  # the HTML renderer lands separately
        return None
    from analyzer.job.result import Result
    return HtmlRenderer().render(Result.from_dict(doc))


def expect_warning(capsys, paths, needle):
    doc, text, html = outputs(capsys, *paths)
    assert any(needle in w for w in doc["warnings"]), doc["warnings"]
    assert "warning: " in text and needle in " ".join(text.split())
    if html is not None:
        import html as html_lib
        assert needle in html_lib.unescape(html)
    return doc


def metrics(doc, rank=0):
    row = next(r for r in doc["ranks"] if r["rank"] == rank)
    return {k: row[k] for k in BASELINE}


def write_doc(path, doc):
    path.write_text(json.dumps(doc))
    return path


# -- refused with one line ---------------------------------------------------------------------

def test_truncated_gzip(tmp_path, capsys):
    data = gzip.compress(json.dumps(two_step_ddp().doc).encode() * 20)
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(data[: len(data) * 2 // 3])
    expect_error(capsys, [bad], bad, "truncated gzip")


def test_gzip_bomb_refused_past_the_cap(tmp_path, capsys):
    bomb = tmp_path / "rank-0.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write(b'{"traceEvents": [' + b" " * (20 << 20))  # 20 MB of blanks -> ~20 KB
    assert bomb.stat().st_size < 100_000
    expect_error(capsys, ["--max-inflate-gb", "0.005", bomb], bomb, "inflates past", "5,000,000")
    from analyzer.api import DiagnoseOptions
    assert DiagnoseOptions().max_inflate_bytes == 8 * 10**9  # the documented default


@pytest.mark.parametrize("text, needle", [
    ('{"traceEvents": [ {"ph": "X",', "invalid JSON"),
    ('{"traceEvents": [{"ph": "X"}]]', "invalid JSON"),
    ("\x00\x01binary", "invalid JSON"),
    ('{"hello": 1}', "no traceEvents"),
    ('[1, 2, 3]', "not a Kineto trace"),
    ('42', "not a Kineto trace"),
    ('"just a string"', "not a Kineto trace"),
    ('{"traceEvents": []}', "empty traceEvents"),
    ('{"traceEvents": {"ph": "X"}}', "traceEvents"),
    ('{"traceEvents": 5}', "traceEvents"),
    ('{"traceEvents": "events"}', "traceEvents"),
    ('{"traceEvents": [1, 2]}', "not a Kineto trace"),
    ('{"traceEvents": [{"ph": "X", "args": 7}]}', "not a Kineto trace"),
])
def test_invalid_json_and_json_that_is_not_a_trace(tmp_path, capsys, text, needle):
    bad = tmp_path / "rank-0.json"
    bad.write_text(text)
    expect_error(capsys, [bad], bad, needle)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals(tmp_path, capsys, literal):
    """Not JSON, but Python's json.dump writes them: read as null, so the event whose ts or dur
    was one is ignored (a NaN elsewhere changes nothing), with a warning."""
    b = two_step_ddp()
    b.kernel("gemm_nan", 1000, 12345, launch_ts=995)
    b.cpu("python_function", 900, 1, note=0.5)
    text = json.dumps(b.doc).replace('"dur": 12345', f'"dur": {literal}').replace('"note": 0.5', f'"note": {literal}')
    path = tmp_path / "rank-0.json"
    path.write_text(text)
    doc = expect_warning(capsys, [path], "NaN/Infinity literals")
    assert metrics(doc) == BASELINE
    assert any("1 GPU event(s)" in w and "ignored" in w for w in doc["warnings"])


def test_empty_file_and_empty_gzip(tmp_path, capsys):
    empty = tmp_path / "rank-0.json"
    empty.write_bytes(b"")
    expect_error(capsys, [empty], empty, "empty file")
    empty_gz = tmp_path / "rank-1.json.gz"
    empty_gz.write_bytes(gzip.compress(b""))
    expect_error(capsys, [empty_gz], empty_gz, "empty")


def test_mixed_world_sizes(tmp_path, capsys):
    a = two_step_ddp(rank=0).write(tmp_path / "a.json")
    b = two_step_ddp(rank=1, world_size=4, pg_ranks=(0, 1, 2, 3)).write(tmp_path / "b.json")
    err = expect_error(capsys, [a, b], a, "world_size differs")
    assert "b.json=4" in err


def test_duplicate_ranks_name_both_files(tmp_path, capsys):
    a = two_step_ddp(rank=1).write(tmp_path / "a.json")
    b = two_step_ddp(rank=1).write(tmp_path / "b.json")
    expect_error(capsys, [a, b], b, "duplicate rank 1", str(a))


def test_missing_distributed_info_and_no_rank_in_names(tmp_path, capsys):
    paths = []
    for name in ("first.json", "second.json"):
        b = two_step_ddp()
        del b.doc["distributedInfo"]
        paths.append(b.write(tmp_path / name))
    expect_error(capsys, paths, paths[0], "cannot tell the rank")


def test_directory_with_unrelated_files(tmp_path, capsys):
    two_step_ddp(rank=0).write(tmp_path / "rank-0.json")
    two_step_ddp(rank=1).write(tmp_path / "rank-1.json.gz", gz=True)
    (tmp_path / "README.md").write_text("# notes")
    (tmp_path / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "rank-2.json.bak").write_text("{")
    (tmp_path / "sub").mkdir()
    doc, _, _ = outputs(capsys, tmp_path)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    # an unrelated JSON file in a scanned directory is left out and named in a warning
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    doc, _, _ = outputs(capsys, tmp_path)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert any("not traces" in w and "config.json" in w for w in doc["warnings"])
    # ... but named on purpose, it is an error
    expect_error(capsys, [tmp_path / "config.json"], tmp_path / "config.json", "no traceEvents")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing here")
    expect_error(capsys, [empty], empty, "no trace files")


def test_gz_name_without_gzip_and_gzip_without_gz_name(tmp_path, capsys):
    plain = two_step_ddp(rank=0).write(tmp_path / "rank-0.json.gz")  # plain JSON, .gz name
    packed = two_step_ddp(rank=1).write(tmp_path / "rank-1.json", gz=True)  # gzip, .json name
    doc, _, _ = outputs(capsys, plain, packed)
    assert metrics(doc, 0) == BASELINE and metrics(doc, 1) == BASELINE
    garbage = tmp_path / "rank-2.json.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00not really gzip at all")
    expect_error(capsys, [garbage], garbage, "gzip")


# -- correct partial results with a warning ----------------------------------------------------

def test_events_without_ts_dur_or_ph(tmp_path, capsys):
    b = two_step_ddp()
    b.events.append({"ph": "X", "cat": "kernel", "name": "no_ts", "dur": 50, "args": {"stream": 7}})
    b.events.append({"ph": "X", "cat": "kernel", "name": "no_dur", "ts": 1000, "args": {"stream": 7}})
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "were ignored")
    assert metrics(doc) == BASELINE
    # No 'ph' but a GPU category, ts and dur: judged by its fields, i.e. a kernel [1000, 1500)
    # that covers the whole trace (documented in docs/scale.md "Bad input").
    b.events.append({"cat": "kernel", "name": "no_ph", "ts": 1000, "dur": 500, "args": {"stream": 7}})
    doc, _, _ = outputs(capsys, b.write(tmp_path / "rank-0.json"))
    assert metrics(doc)["compute_us"] == 500.0 and metrics(doc)["exposed_comm_us"] == 0.0


def test_numbers_written_as_strings(tmp_path, capsys):
    b = two_step_ddp()
    for event in b.events:
        event["ts"], event["dur"] = str(event["ts"]), str(event["dur"])
    doc, _, _ = outputs(capsys, b.write(tmp_path / "rank-0.json"))
    assert metrics(doc) == BASELINE  # numeric strings are numbers
    b.events.append({"ph": "X", "cat": "kernel", "name": "x", "ts": "soon", "dur": "long", "args": {"stream": 7}})
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "non-numeric")
    assert metrics(doc) == BASELINE


def test_negative_and_absurd_durations_ignored(tmp_path, capsys):
    b = two_step_ddp()
    b.kernel("gemm_backwards_in_time", 1000, -500, launch_ts=995)
    b.kernel("gemm_for_ever", 1000, 1e300, launch_ts=995)  # would overflow int64 nanoseconds
    b.kernel("gemm_far_future", 1e18, 1, launch_ts=995)
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "negative or out-of-range")
    assert metrics(doc) == BASELINE
    assert any(w.startswith("rank 0") and "3 GPU event(s)" in w for w in doc["warnings"])


def test_duplicate_events_count_once(tmp_path, capsys):
    """A trace merged twice (every event written two times) must not double the collectives,
    the buckets or any time: exact duplicate events are dropped, with a warning."""
    b = two_step_ddp()
    clean = b.write(tmp_path / "clean" / "rank-0.json") if (tmp_path / "clean").mkdir() is None else None
    base_doc, _, _ = outputs(capsys, clean)
    b.events.extend([dict(e) for e in b.events])
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "duplicate")
    assert metrics(doc) == BASELINE
    assert len(doc["collectives"]) == len(base_doc["collectives"]) == 2
    assert len(doc["buckets"]) == len(base_doc["buckets"])


def test_events_outside_any_step(tmp_path, capsys):
    b = two_step_ddp()
    b.kernel("late_gemm", 2000, 10, launch_ts=1995)  # after ProfilerStep#2 ended
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "outside every ProfilerStep")
    rank = doc["ranks"][0]
    assert rank["compute_us"] == 160.0 and sum(s["compute_us"] for s in rank["steps"]) == 150.0


def test_single_file_without_distributed_info(tmp_path, capsys):
    b = two_step_ddp()
    del b.doc["distributedInfo"]
    doc = expect_warning(capsys, [b.write(tmp_path / "trace.json")], "no distributedInfo")
    assert doc["ranks"][0]["rank"] == 0 and doc["job"]["world_size"] is None
    assert metrics(doc) == BASELINE


def test_implausible_rank_in_distributed_info(tmp_path, capsys):
    """A rank beyond any job's size (2**70: a fuzzer's) is ignored with a warning, not an
    internal error; the file name gives the rank instead."""
    b = two_step_ddp()
    b.doc["distributedInfo"]["rank"] = 2**70
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "is not a rank of this job")
    assert doc["ranks"][0]["rank"] == 0 and doc["ranks"][0]["rank_source"] == "file name"


def test_clock_skew_between_ranks(tmp_path, capsys):
    """Rank 1's clock runs 7 s ahead: per-rank figures are unchanged, and cross-rank waits are
    never negative (they are measured on durations, clocks aligned on collective ends)."""
    a = two_step_ddp(rank=0)
    b = two_step_ddp(rank=1)
    for event in b.events:
        event["ts"] += 7_000_000
    doc, _, _ = outputs(capsys, a.write(tmp_path / "rank-0.json"), b.write(tmp_path / "rank-1.json"))
    assert metrics(doc, 0) == metrics(doc, 1) == BASELINE
    for row in doc["collectives"]:
        assert row.get("wait_us") is None or row["wait_us"] >= 0
    stragglers = doc.get("stragglers") or {}
    for entry in stragglers.get("ranks", []):
        assert all(v >= 0 for k, v in entry.items() if k.startswith("wait_") and isinstance(v, (int, float)))


def test_no_nccl_kernels(tmp_path, capsys):
    b = TraceBuilder()
    b.cpu("ProfilerStep#1", 0, 100, cat="user_annotation")
    b.kernel("gemm", 10, 40, launch_ts=5)
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "no communication kernels")
    assert doc["ranks"][0]["comm_us"] == 0 and doc["ranks"][0]["compute_us"] == 40.0


def test_nccl_kernels_without_cpu_link(tmp_path, capsys):
    b = two_step_ddp()
    for event in b.events:
        if event["cat"] == "kernel" and event["name"].startswith("nccl"):
            del event["args"]["correlation"]
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "no CPU-side launch link")
    assert metrics(doc) == BASELINE  # time figures need no link
    assert [c["collective"] for c in doc["collectives"]] == ["allreduce", "allreduce"]
    assert all(c["bytes"] is None and c["launch_us"] is None for c in doc["collectives"])


def test_unknown_dtype_leaves_bytes_empty(tmp_path, capsys):
    b = two_step_ddp()
    for event in b.events:
        if event["name"] == "record_param_comms":
            event["args"]["dtype"] = "Quaternion128"
        if event["name"].startswith("nccl"):
            event["name"] = "ncclDevKernel_AllReduce_Sum_q128_RING_LL"  # no dtype in the name either
    doc = expect_warning(capsys, [b.write(tmp_path / "rank-0.json")], "unknown message size")
    assert all(c["bytes"] is None and c["in_nelems"] == 1000 for c in doc["collectives"])
    assert metrics(doc) == BASELINE


def test_hundred_thousand_character_names(tmp_path, capsys):
    huge = "k" * 100_000
    b = two_step_ddp(host="h" * 100_000)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_" + huge, 1300, 50, stream=20, launch_ts=1295)
    b.cpu("ProfilerStep#3", 1290, 100, cat="user_annotation")
    doc, text, html = outputs(capsys, b.write(tmp_path / "rank-0.json"))
    assert any(c["kernel"].endswith(huge) for c in doc["collectives"])
    assert all(len(line) <= 100 for line in text.splitlines())
    assert doc["ranks"][0]["comm_us"] == 110.0


def test_non_utf8_bytes_are_replaced_with_a_warning(tmp_path, capsys):
    data = json.dumps(two_step_ddp().doc).encode()
    data = data.replace(b'"multi_tensor_apply_kernel"', b'"multi_tensor_\xff\xfe_kernel"')
    bad = tmp_path / "rank-0.json"
    bad.write_bytes(data)
    doc = expect_warning(capsys, [bad], "not valid UTF-8")
    assert metrics(doc) == BASELINE


@pytest.mark.parametrize("at", [0, 150, 399])
def test_a_number_beyond_any_field_is_named_at_its_event_by_both_loaders(tmp_path, at):
    """A literal no field can hold (``1e999``) is read as null with a warning naming its event,
    counted over the whole trace wherever the decoder met it: in a batch, or in the text after
    the last cut (decoded as a whole document), by the one-process and the two-process loader
    alike (the fuzzer found the tail's index counted from the tail, and differently by the two)."""
    from analyzer.ingest.loader import load_rank_trace
    from analyzer.ingest.parallel import load_rank_trace_parallel
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{k}", "pid": 1, "tid": 1, "ts": 1000 + 10 * k, "dur": 5}
              for k in range(400)]
    text = json.dumps({"traceEvents": events})
    marker = f'"ts": {1000 + 10 * at}, '
    assert text.count(marker) == 1
    path = tmp_path / "rank-0.json"
    path.write_text(text.replace(marker, '"ts": 1e999, '))
    expected = f"first at $.traceEvents[{at}].ts"
    for load in (load_rank_trace, lambda p: load_rank_trace_parallel(p, chunk_bytes=4096)):
        warnings = load(path).warnings
        assert any(expected in w for w in warnings), warnings
