"""Streaming ingest: however the JSON text is cut into chunks, the columns equal those of one
whole decode, on real traces and on events built to fool a boundary finder."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest import stream
from analyzer.ingest.classify import KernelClassifier
from analyzer.ingest.columns import ColumnBuilder
from analyzer.ingest.files import iter_trace_chunks, read_trace_bytes
from analyzer.ingest.loader import load_rank_trace
from builders import two_step_ddp
from conftest import SAMPLES
from trace_compare import assert_same, resolved

TRICKY_NAMES = [
    '},{"ph":"X","cat":"kernel","name":"fake","ts":1,"dur":1000000,"args":{"stream":7}},{',
    'ends with backslash \\',
    'quote \\" then }, {"ph": "X"} ',
    '\\\\"}, {',
    "brackets [[[ {{{ ]]] }}}",
    "unicode \u007d, \u2028 \u00e9 \U0001f600",
    "x" * 3000 + "},",
]


def columns(path: Path, pieces: list[bytes]):
    builder = ColumnBuilder(KernelClassifier())
    meta, decoding = stream.decode_stream(path, iter(pieces), builder.add)
    warnings: list[str] = []
    gpu, kernel_args, launches, markers = builder.finish(warnings)
    # String ids follow the order names were first met, which depends on the batches: compare
    # the names themselves.
    names, threads = np.array(builder.names.strings, dtype=object), np.array(builder.threads.strings, dtype=object)
    resolved = {"gpu": dict(vars(gpu), name=names[gpu.name]),
                "launches": dict(vars(launches), thread=threads[launches.thread]),
                "markers": dict(vars(markers), name=names[markers.name], thread=threads[markers.thread])}
    return {**resolved, "args": kernel_args, "strings": set(builder.names.strings),
            "threads": set(builder.threads.strings), "events": builder.event_count,
            "warnings": warnings, "meta": meta.distributedInfo}


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, at = [], 0
    for size in sizes:
        if at >= len(data):
            break
        pieces.append(data[at:at + size])
        at += size
    if at < len(data):
        pieces.append(data[at:])
    return pieces


def tricky_trace(names=TRICKY_NAMES, bare_array=False, events_first=False) -> bytes:
    b = two_step_ddp()
    for k, name in enumerate(names):
        b.kernel(name, 2000 + 10 * k, 5, launch_ts=1999 + 10 * k, extra={"a": {"b": [1, {"c": "},"}]}, "d": name})
        b.cpu(name, 1999 + 10 * k, 1)
    if bare_array:
        return json.dumps(b.events).encode()
    doc = dict(b.doc)
    if events_first:
        doc = {"traceEvents": doc.pop("traceEvents"), **doc}
    return json.dumps(doc, indent=1 if events_first else None).encode()


@pytest.mark.parametrize("layout", ["meta_first", "events_first", "bare_array"])
def test_tricky_boundaries_any_chunking(tmp_path, layout):
    data = tricky_trace(bare_array=layout == "bare_array", events_first=layout == "events_first")
    path = tmp_path / "rank-0.json"
    whole = columns(path, [data])
    assert whole["events"] > 40 and "fake" not in whole["strings"]
    for size in (7, 61, 500, 4096):
        assert_same(columns(path, split(data, [size] * (len(data) // size + 1))), whole)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=60))
def test_random_chunking_equals_whole_decode(sizes):
    data = tricky_trace()
    path = Path("rank-0.json")
    assert_same(columns(path, split(data, sizes)), columns(path, [data]))


def real_and_sample_files():
    from conftest import REAL_TRACES
    files = sorted(REAL_TRACES.rglob("*.json*"))[:3] if REAL_TRACES.is_dir() else []
    return files + sorted(SAMPLES.glob("*/*/rank-0.*json*"))[:3]


@pytest.mark.parametrize("path", real_and_sample_files(), ids=lambda p: p.parent.name)
def test_real_traces_stream_like_whole(path):
    data = read_trace_bytes(path)
    whole = columns(path, [data])
    rng = random.Random(7)
    assert_same(columns(path, split(data, [rng.randrange(1 << 14, 1 << 17) for _ in range(len(data) >> 13)])), whole)
    assert whole["events"] > 1000


def test_load_uses_small_chunks_and_gzip(tmp_path, monkeypatch):
    """End to end through the file reader, with chunks far smaller than the file."""
    data = tricky_trace()
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(data)
    packed = tmp_path / "rank-0.json.gz"
    packed.write_bytes(gzip.compress(data))
    seen = []

    def small_chunks(path, cap):
        for piece in iter_trace_chunks(path, cap, chunk_bytes=997):
            seen.append(len(piece))
            yield piece
    import analyzer.ingest.loader as loader
    whole = load_rank_trace(plain)
    monkeypatch.setattr(loader, "iter_trace_chunks", small_chunks)
    for path in (plain, packed):
        seen.clear()
        streamed = load_rank_trace(path)
        assert len(seen) > 5 and max(seen) <= 4 << 20
        np.testing.assert_array_equal(streamed.gpu.ts, whole.gpu.ts)
        assert [streamed.strings[i] for i in streamed.gpu.name] == [whole.strings[i] for i in whole.gpu.name]
        assert streamed.kernel_comm_args == whole.kernel_comm_args


@pytest.mark.parametrize("text, problem", [
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "cat": 5}]}', "$.traceEvents[1].cat"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "X"} {"ph": "X"}]}', "invalid JSON"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}', "ends early"),
    (b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "name": "unterminated}]}', "ends early"),
    (b'{"traceEvents": [] , "traceEvents" : 3}', "traceEvents"),
])
def test_errors_point_into_the_file_whatever_the_chunking(tmp_path, text, problem):
    from analyzer.base.errors import InputError
    path = tmp_path / "rank-0.json"
    messages = set()
    for size in (3, 11, len(text)):
        with pytest.raises(InputError) as info:
            columns(path, split(text, [size] * len(text)))
        assert str(info.value).startswith(str(path)) and problem in str(info.value)
        messages.add(str(info.value))
    assert len(messages) == 1  # the same message however the text arrived


def test_scanner_finds_true_element_ends():
    text = b'{"a":"}\\"}"}, [1,{"b":[]}], "s\\\\", {"c":{}}] , {"tail": {}}'
    ends = []
    buf = bytearray(text)
    stop = len(buf)
    while True:
        end, closed = stream.last_element_end(buf, stop)
        assert closed == (stop == len(buf))  # only the whole text holds the array's "]"
        if end is None:
            break
        ends.append(end)
        stop = end
    # elements: an object, an array, a string, an object; a string ends with no bracket
    assert [text[e:e + 1] for e in ends] == [b"}", b"]", b"}"]
    assert ends[0] == text.index(b"}] ,")
    depth, in_string = stream.scan_state(buf, 0, text.index(b"\\\\") + 1)
    assert in_string and depth == 0


# -- two cores: the parallel loader gives the sequential loader's RankTrace ------------------

def two_core_files():
    return real_and_sample_files() + sorted(SAMPLES.glob("gpu_h200/*/rank-0.*"))


@pytest.mark.parametrize("path", two_core_files(), ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_two_core_load_equals_sequential(path, monkeypatch):
    from analyzer.ingest import parallel
    from analyzer.rank.analysis import RankOptions, analyze_rank
    sequential = load_rank_trace(path)

    def no_fallback(*args):
        raise AssertionError("a well-formed trace must not need the sequential loader")
    monkeypatch.setattr(parallel, "load_rank_trace", no_fallback)
    # small slices, so that both processes work and the merge is exercised
    two_cores = parallel.load_rank_trace_parallel(path, chunk_bytes=1 << 18)
    assert_same(resolved(two_cores), resolved(sequential))
    assert analyze_rank(two_cores, RankOptions()) == analyze_rank(sequential, RankOptions())


@pytest.mark.parametrize("trouble", ["cut inside a string", "NaN literal", "invalid UTF-8", "truncated gzip"])
def test_two_core_load_hands_trouble_to_the_sequential_loader(tmp_path, trouble):
    from analyzer.base.errors import InputError
    from analyzer.ingest.parallel import load_rank_trace_parallel
    data = tricky_trace()
    if trouble == "NaN literal":
        data = data.replace(b'"dur": 5,', b'"dur": NaN,', 1)
    if trouble == "invalid UTF-8":
        data = data.replace(b"brackets", b"br\xffckets", 1)
    path = tmp_path / "rank-0.json"
    path.write_bytes(data)
    if trouble == "truncated gzip":
        path = tmp_path / "rank-0.json.gz"
        path.write_bytes(gzip.compress(data)[:-200])
        with pytest.raises(InputError) as sequential_error:
            load_rank_trace(path)
        with pytest.raises(InputError) as parallel_error:
            load_rank_trace_parallel(path, chunk_bytes=512)
        assert str(parallel_error.value) == str(sequential_error.value)
        return
    sequential = load_rank_trace(path)
    assert_same(resolved(load_rank_trace_parallel(path, chunk_bytes=512)), resolved(sequential))
    if trouble != "cut inside a string":
        assert sequential.warnings, "the trouble must be visible"


def test_two_core_load_with_spawned_helper(monkeypatch):
    """macOS and Windows spawn the helper (a fresh interpreter) instead of forking it."""
    import multiprocessing
    from analyzer.ingest import parallel
    path = SAMPLES / "gpu_h200" / "fsdp2" / "rank-0.pt.trace.json.gz"
    monkeypatch.setattr(parallel, "_context", lambda: multiprocessing.get_context("spawn"))
    monkeypatch.setattr(parallel, "load_rank_trace", lambda *a: pytest.fail("fell back to the sequential loader"))
    assert_same(resolved(parallel.load_rank_trace_parallel(path, chunk_bytes=1 << 18)), resolved(load_rank_trace(path)))


@pytest.mark.parametrize("separator", [b",", b" ,\n ", b"\n,\t"])
def test_decode_cut_in_place_equals_a_copied_slice(separator):
    """The sequential decoder reads the events before a cut in place (the comma briefly read as
    ``]``): the same events as the copied slice the two-core loader decodes, and the buffer
    as it was, whatever blanks surround the comma."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i} }},{{", "ts": i, "dur": 1, "args": {"stream": 7}}
              for i in range(5)]
    text = separator.join(json.dumps(e).encode() for e in events) + separator + b'{"ph": "X"'
    store = stream.bracketed(memoryview(text))
    before = bytes(store)
    brace, after_comma = stream.last_candidate_cut(memoryview(store)[1:])
    state = stream.Decoding("rank-0.json")
    in_place = stream.decode_cut(state, store, after_comma)
    copied = stream.EVENTS_DECODER.decode(stream.events_slice(text, brace))
    assert in_place == copied and len(in_place) == 5
    assert bytes(store) == before


def test_decode_cut_fixes_nonfinite_in_a_copy():
    text = b'{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1},{"ph": "X"'
    store = stream.bracketed(text)
    before = bytes(store)
    state = stream.Decoding("rank-0.json")
    events = stream.decode_cut(state, store, stream.last_candidate_cut(memoryview(store)[1:])[1])
    assert len(events) == 1 and events[0].ts is None and state.replaced_nonfinite == 1
    assert bytes(store) == before


def _counting(monkeypatch, piece: int) -> list[int]:
    """Pieces of ``piece`` bytes (PIECE_BYTES), and the size of every batch handed on."""
    monkeypatch.setattr(stream, "PIECE_BYTES", piece)
    batches: list[int] = []
    add = ColumnBuilder.add
    monkeypatch.setattr(ColumnBuilder, "add", lambda self, events: (batches.append(len(events)), add(self, events)))
    return batches


@pytest.mark.parametrize("piece", [16, 333, 5000])
def test_pieces_decode_like_whole(monkeypatch, piece):
    """The text before a cut decoded in pieces (issue 42, fifth pass) gives the columns of one
    decode, also where a piece's cut falls inside a string or a nested object (TRICKY_NAMES:
    the rest is then decoded as one, as before)."""
    data = tricky_trace()
    path = Path("rank-0.json")
    whole = columns(path, [data])
    batches = _counting(monkeypatch, piece)
    assert_same(columns(path, [data]), whole)
    assert len(batches) > (3 if piece < 5000 else 1)
    assert_same(columns(path, split(data, [2000] * (len(data) // 2000 + 1))), whole)


@pytest.mark.parametrize("bad, problem", [
    (b'{"ph": "X", "cat": 5}', "$.traceEvents[300].cat"),
    (b'{"ph": "X"} {"ph": "X"}', "invalid JSON"),
    (b'{"ph": "X", "name": "unterminated}', "invalid JSON"),
    (b'{"ph": "X", "name": "a}, {\\"ph\\": 3", "cat": 5}', "$.traceEvents[300].cat"),
])
def test_errors_in_a_later_piece_read_as_before(tmp_path, monkeypatch, bad, problem):
    """Bad data after many good events: the message (the event's index, the byte offset) is the
    one the whole decode gives, whatever the piece size."""
    from analyzer.base.errors import InputError
    text = b'{"traceEvents": [' + b'{"ph": "X", "name": "a"}, ' * 300 + bad + b', {"ph": "X"}' * 300 + b']}'
    path = tmp_path / "rank-0.json"
    messages = set()
    for piece in (1 << 30, 64, 1000):
        monkeypatch.setattr(stream, "PIECE_BYTES", piece)
        for size in (50, len(text)):
            with pytest.raises(InputError) as info:
                columns(path, split(text, [size] * len(text)))
            assert problem in str(info.value)
            messages.add(str(info.value))
    assert len(messages) == 1, messages


def test_pieces_fix_each_departure_once(monkeypatch):
    """NaN literals, invalid UTF-8 and numbers beyond any field in later pieces: read as in one
    decode, with the same record of what was replaced (the first huge number's place)."""
    good = b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "args": {"stream": 7}}, '
    odd = [b'{"ph": "X", "cat": "kernel", "name": "n", "ts": NaN, "dur": 2, "args": {"stream": 7}}, ',
           b'{"ph": "X", "cat": "kernel", "name": "\xff\xfe", "ts": 5, "dur": 2, "args": {"stream": 7}}, ',
           b'{"ph": "X", "cat": "kernel", "name": "h", "ts": 5, "dur": 1' + b"0" * 5000 + b', "args": {"stream": 7}}, ']
    text = b'{"traceEvents": [' + good * 100 + b"".join(odd[k] + good * 50 for k in (0, 1, 2, 0, 2)) + good + \
        b'{"ph": "X"}]}'
    path = Path("rank-0.json")

    def decoded():
        builder = ColumnBuilder(KernelClassifier())
        _, state = stream.decode_stream(path, iter([text]), builder.add)
        warnings: list[str] = []
        gpu = builder.finish(warnings)[0]
        return (bool(state.replaced_utf8), bool(state.replaced_nonfinite), state.replaced_huge[:1], warnings,
                builder.event_count, gpu.ts.tolist(), gpu.end.tolist())
    whole = decoded()
    assert whole[:3] == (True, True, ["$.traceEvents[202].dur"]) and whole[3]
    batches = _counting(monkeypatch, 200)
    assert decoded() == whole
    assert len(batches) > 10


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4000), st.lists(st.integers(1, 3000), min_size=1, max_size=30))
def test_random_pieces_and_chunking_equal_whole(piece, sizes):
    data = tricky_trace()
    path = Path("rank-0.json")
    whole = columns(path, [data])
    default, stream.PIECE_BYTES = stream.PIECE_BYTES, piece
    try:
        assert_same(columns(path, split(data, sizes)), whole)
        assert_same(columns(path, [data]), whole)
    finally:
        stream.PIECE_BYTES = default
