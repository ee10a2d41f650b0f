"""The per-rank speed-ups of issue 13 give exactly what the row-by-row code gave.

Each shortcut is checked on generated inputs against a plain statement of what it must give:
interning pre-factorized names, the metadata-free fast path of ``comm_args_of``, the column-wise
µs rounding of collective rows, the metadata merge, the process-group lookup by name, the thread
labels, and the reuse of the trace just loaded for the report's step timeline.
"""

from __future__ import annotations

import copy
import functools
import json
import multiprocessing
import os
import shutil
from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.base.limits import MAX_COMMS_ID, MAX_DEVICE_BYTES, MAX_ID, MAX_WORLD
from analyzer.ingest.classify import KernelClassifier
from analyzer.ingest.columns import (
    ColumnBuilder,
    CommArgsBuilder,
    Interner,
    Rejected,
    comm_args_of,
    factorize,
    parse_ranks,
    thread_ids,
    to_int,
)
from analyzer.ingest.schema import Event, EventArgs
from analyzer.rank.comms import _group_of, _groups_by_name, _merge_sources, _us3

NAMES = st.sampled_from(["aten::mm", "ProfilerStep#3", "nccl:all_reduce", "", "record_param_comms", "x"])


@settings(max_examples=200, deadline=None)
@given(st.lists(NAMES, max_size=40), st.lists(NAMES, max_size=10), st.data())
def test_ids_of_codes_interns_like_ids(names, earlier, data):
    """Interning a subset of factorized rows gives the ids (and string table) that interning
    the subset's values would, after the same earlier strings."""
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, max(len(names) - 1, 0)))) if names else []),
                    dtype=np.int64)
    codes, uniques = factorize(names)
    reference, fast = Interner(), Interner()
    reference.ids(earlier)
    fast.ids(earlier)
    expected = reference.ids([names[i] for i in rows.tolist()])
    got = fast.ids_of_codes(codes[rows], uniques)
    assert got.tolist() == expected.tolist()
    assert fast.strings == reference.strings


OTHER = st.one_of(st.none(), st.integers(0, 9), st.just("7"))
# One collective field at a time, with a valid value, and the key it must give.
ONE_FIELD = st.sampled_from([("collective_name", "allreduce", "collective"), ("in_nelems", "4", "in_nelems"),
                             ("out_nelems", 4, "out_nelems"), ("group_size", 2.0, "group_size"),
                             ("seq", 0, "seq"), ("comms_id", 12, "comms_id"), ("dtype", "Float", "dtype"),
                             ("pg_name", 0, "pg_name"), ("pg_desc", "dp", "pg_desc"),
                             ("pg_ranks", "[0, 1]", "pg_ranks")])


@settings(max_examples=200, deadline=None)
@given(OTHER, OTHER, OTHER, ONE_FIELD)
def test_comm_args_fast_path(correlation, external_id, stream, field):
    """Args without collective metadata (whatever else they hold) give {}; any one collective
    field, however written, is still read."""
    plain = dict(correlation=correlation, external_id=external_id, stream=stream)
    assert comm_args_of(EventArgs(**plain)) == {}
    assert comm_args_of(None) == {}
    name, value, key = field
    assert list(comm_args_of(EventArgs(**plain, **{name: value}))) == [key]
    shaped = comm_args_of(EventArgs(**plain, input_dims=msgspec.Raw(b"[[2, 3]]"), input_type=msgspec.Raw(b'["float"]')))
    assert shaped == {"input_dims": [[2, 3]], "input_types": ["float"]}


def walked_comm_args(args: EventArgs) -> dict:
    """comm_args_of as a plain walk over the fields of one event (the code before issue 13's
    cache of repeating fields), with issue 30's limits: a value beyond what a job can have is
    left out (a message beyond any device, a group beyond any world, an id beyond its width)."""
    info: dict = {}
    if args.collective_name:
        info["collective"] = args.collective_name
    limits = {"in_nelems": MAX_DEVICE_BYTES, "out_nelems": MAX_DEVICE_BYTES, "group_size": MAX_WORLD,
              "seq": MAX_ID, "comms_id": MAX_COMMS_ID}
    for key in ("in_nelems", "out_nelems", "group_size", "seq", "comms_id"):
        value = to_int(getattr(args, key))
        if 0 <= value <= limits[key]:
            info[key] = value
    ranks = parse_ranks(args.pg_ranks)
    if ranks is not None and not all(0 <= r < MAX_WORLD for r in ranks):
        ranks = None
    for key, value in (("dtype", args.dtype), ("pg_name", None if args.pg_name is None else str(args.pg_name)),
                       ("pg_desc", args.pg_desc), ("pg_ranks", ranks)):
        if value is not None and (value or key == "pg_name" or key == "pg_ranks"):
            info[key] = value
    if len(args.input_dims):
        info["input_dims"] = json.loads(bytes(args.input_dims))
        info["input_types"] = json.loads(bytes(args.input_type)) if len(args.input_type) else None
    return info


INT_LIKE = st.one_of(st.none(), st.integers(-2, 2**64), st.integers(-2**70, 2**70), st.sampled_from([1.0, 2.5, -0.0, "3", "x", "1e3", float("nan")]))
COMM_ARGS = st.builds(
    EventArgs, collective_name=st.sampled_from([None, "", "allreduce", "allgather"]), in_nelems=INT_LIKE,
    out_nelems=INT_LIKE, group_size=INT_LIKE, seq=INT_LIKE, comms_id=INT_LIKE,
    dtype=st.sampled_from([None, "", "BFloat16"]), pg_name=st.sampled_from([None, 0, "0", "", "tp"]),
    pg_desc=st.sampled_from([None, "", "default_pg"]),
    pg_ranks=st.sampled_from([None, "[0, 1]", "[]", " [2, 3] ", "bad", [0, 1], [True], []]),
    input_dims=st.sampled_from([msgspec.Raw(b""), msgspec.Raw(b"[[2, 3]]"), msgspec.Raw(b"[[4], []]")]),
    input_type=st.sampled_from([msgspec.Raw(b""), msgspec.Raw(b'["float"]')]))


@settings(max_examples=300, deadline=None)
@given(st.lists(COMM_ARGS, min_size=1, max_size=6))
def test_comm_args_match_a_plain_walk(many):
    """The per-combination cache gives each event the dict (keys in the same order, its own
    rank list) a walk over its own fields gives, whichever events were read before it."""
    got = [comm_args_of(args) for args in many]
    for args, info in zip(many, got):
        expected = walked_comm_args(args)
        assert info == expected and list(info) == list(expected)
    lists = [id(info["pg_ranks"]) for info in got if "pg_ranks" in info]
    assert len(lists) == len(set(lists))


def comm_args_columns(args: list[EventArgs], rows: np.ndarray, rejected: Rejected | None = None, batches: int = 1):
    """The CommArgs of ``args`` at ``rows``, added in ``batches`` batches, rows kept in place."""
    builder = CommArgsBuilder()
    for part in np.array_split(np.arange(len(args)), batches):
        builder.add([args[i] for i in part.tolist()], rows[part], rejected)
    return builder.finish(np.arange(int(rows.max()) + 1 if len(rows) else 0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(COMM_ARGS, st.builds(EventArgs, correlation=OTHER, stream=OTHER)), max_size=12),
       st.integers(1, 4))
def test_comm_args_columns_are_the_walk_per_row(many, batches):
    """The columns hold exactly the events with collective metadata, each read back as the dict
    a plain walk over its own fields gives (keys in order, its own rank list), whatever was read
    before it and however the events came in batches; unusable values are counted as one event
    at a time counts them (the same count and first example per field)."""
    rows = np.arange(len(many), dtype=np.int64) * 3 + 5
    rejected, one_by_one = Rejected(), Rejected()
    got = comm_args_columns(many, rows, rejected, batches)
    expected = {}
    for row, args in zip(rows.tolist(), many):
        if comm_args_of(args, one_by_one):
            expected[row] = walked_comm_args(args)
    assert got == expected and list(got) == list(expected)
    assert all(list(got.get(row)) == list(info) for row, info in expected.items())
    assert rejected == one_by_one
    infos = [info for _, info in got.items()]  # held: their lists' ids stay unique
    lists = [id(info["pg_ranks"]) for info in infos if "pg_ranks" in info]
    assert len(lists) == len(set(lists))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 30), st.integers(0, 2**63 - 1), max_size=20), st.data())
def test_comm_args_reorder_matches_a_walk(args, data):
    """Args keyed by old row, after a reorder that drops rows (``CommArgsBuilder.finish``), as
    the row-by-row remap gave them."""
    order = np.array(data.draw(st.permutations(range(data.draw(st.integers(0, 25)))))[:data.draw(st.integers(0, 25))],
                     dtype=np.int64)
    rows = np.array(sorted(args), dtype=np.int64)
    builder = CommArgsBuilder()
    builder.add([EventArgs(seq=args[row]) for row in rows.tolist()], rows)
    new_of = {int(old): new for new, old in enumerate(order.tolist())}
    expected = {new_of[old]: {"seq": value} for old, value in sorted(args.items()) if old in new_of}
    assert builder.finish(order) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(COMM_ARGS, max_size=10), st.integers(0, 10))
def test_comm_args_merge_is_one_builder(many, cut):
    """Two builders' batches merged (the two-core loader) give the columns one builder gives."""
    rows = np.arange(len(many), dtype=np.int64) * 2
    one, first, second = CommArgsBuilder(), CommArgsBuilder(), CommArgsBuilder()
    one.add(many, rows)
    first.add(many[:cut], rows[:cut])
    second.add(many[cut:], rows[cut:] - (2 * min(cut, len(many))))
    first.merge(second.export(), 2 * min(cut, len(many)))
    order = np.arange(2 * len(many))
    assert first.finish(order) == one.finish(order)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**52), 2**52), st.integers(-(2**63), 2**63 - 1),
                          st.integers(2**50 - 2**20, 2**50 + 2**20)), max_size=50))
def test_us3_rounds_each_value_like_python(values):
    """Whole traces (and their exact shortcut up to 2**40 µs), absolute clocks, and around the
    shortcut's limit."""
    ns = np.asarray(values, dtype=np.int64)
    assert _us3(ns) == [round(int(v) / 1000.0, 3) for v in values]


def test_us3_half_way_cases():
    """Values whose µs sit on a rounding boundary: Python's correctly rounded round, not numpy's."""
    values = [1_234_5, 2_675, 1_0005, -2_675, 4_503_599_627_370_495]
    assert _us3(np.asarray(values)) == [round(v / 1000.0, 3) for v in values]


class _Rank:
    def __init__(self, groups):
        self.process_groups = groups


def _reference_group(rank, meta, sole_group):
    """What a collective's group is, stated directly: the metadata's fields, each missing one
    taken from the declared groups of that name in order (ranks: the first known; description
    and size: the first non-empty); with no name and no ranks, a lone declared group."""
    name = meta.get("pg_name")
    named = [pg for pg in rank.process_groups if name is not None and pg["name"] == name]
    ranks = next((r for r in [meta.get("pg_ranks")] + [pg["ranks"] for pg in named] if r is not None), None)
    desc = functools.reduce(lambda a, b: a or b, [pg["description"] for pg in named], meta.get("pg_desc"))
    size = functools.reduce(lambda a, b: a or b, [pg["size"] for pg in named], meta.get("group_size"))
    if sole_group and name is None and ranks is None and len(rank.process_groups) == 1:
        lone = rank.process_groups[0]
        name, desc, ranks, size = lone["name"], lone["description"], lone["ranks"], size or lone["size"]
    return {"name": name, "description": desc, "ranks": ranks,
            "size": len(ranks) if ranks is not None and size is None else size}


PG = st.fixed_dictionaries({"name": st.sampled_from(["0", "1", None]),
                            "description": st.sampled_from([None, "", "default_pg", "dp"]),
                            "ranks": st.sampled_from([None, [0, 1], [0, 1, 2, 3]]),
                            "size": st.sampled_from([None, 0, 2, 4])})
META = st.fixed_dictionaries({}, optional={"pg_name": st.sampled_from(["0", "1", "2"]),
                                           "pg_ranks": st.sampled_from([[0], [0, 1]]),
                                           "pg_desc": st.sampled_from(["", "tp"]),
                                           "group_size": st.sampled_from([None, 2, 8])})


@settings(max_examples=300, deadline=None)
@given(st.lists(PG, max_size=4), META, st.booleans())
def test_group_lookup_by_name_matches_scan(groups, meta, sole_group):
    """Repeated names included: every declared group of that name contributes, in order."""
    rank = _Rank(groups)
    expected = _reference_group(rank, meta, sole_group)
    assert _group_of(rank, meta, sole_group, _groups_by_name(rank)) == expected
    assert _group_of(rank, meta, sole_group) == expected


ARGS = st.fixed_dictionaries({}, optional={"collective": st.just("allreduce"), "in_nelems": st.integers(0, 9),
                                           "out_nelems": st.integers(0, 9), "pg_name": st.sampled_from(["0", "1"]),
                                           "dtype": st.sampled_from(["Float", "BFloat16"]), "seq": st.integers(0, 9)})


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), ARGS), st.one_of(st.none(), ARGS))
def test_merge_sources_kernel_args_win(kernel_args, params_args):
    before = copy.deepcopy((kernel_args, params_args))
    meta = _merge_sources(kernel_args, params_args, None, None, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert (kernel_args, params_args) == before  # the sources are not modified
    merged = {}
    for args in (kernel_args, params_args):
        for key, value in (args or {}).items():
            merged.setdefault(key, value)
    sized = [source for source, args in (("kernel args", kernel_args), ("record_param_comms", params_args))
             if args and ("in_nelems" in args or "out_nelems" in args)]
    assert meta["size_source"] == (sized[0] if sized else None)
    for key in ("in_nelems", "out_nelems", "pg_name", "seq"):
        assert meta.get(key) == merged.get(key)
    meta["collective"] = "changed"
    assert (kernel_args, params_args) == before  # the row's meta is its own dict


IDS = st.one_of(st.integers(-3, 3), st.integers(2**62, 2**70), st.sampled_from(["7", "07", "x", ""]), st.none())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(IDS, IDS), max_size=30))
def test_thread_ids_label_each_event(pairs):
    """Each event's thread is "pid:tid" as written (a string "07" stays "07"), interned in
    first-seen order."""
    events = [Event(pid=pid, tid=tid) for pid, tid in pairs]
    threads = Interner()
    ids = thread_ids(events, threads)
    labels = [f"{pid}:{tid}" for pid, tid in pairs]
    assert [threads.strings[i] for i in ids.tolist()] == labels
    assert threads.strings == list(dict.fromkeys(labels))


GPU_CATS = st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"])
GPU_NAMES = st.one_of(st.sampled_from(["ncclKernel_AllReduce", "Memcpy HtoD", "gemm", "kernel"]), st.integers(0, 3),
                      st.none())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(GPU_CATS, GPU_NAMES), min_size=1, max_size=30), st.lists(NAMES, max_size=5))
def test_gpu_kinds_classify_each_row(rows, earlier):
    """Each GPU row's kind is the classifier's for its own category and name (the category taken
    from its group), and the names table gets the names, then the categories, in first-seen order."""
    builder = ColumnBuilder(KernelClassifier())
    builder.names.ids(earlier)
    events = [Event(cat=cat, name=name, ts=1, dur=1, args=EventArgs(stream=7, correlation=i))
              for i, (cat, name) in enumerate(rows)]
    builder.add(events)
    ordered = sorted(range(len(rows)), key=lambda i: rows[i][0])  # grouped by category, stable
    text = ["" if rows[i][1] is None else str(rows[i][1]) for i in ordered]
    classify = KernelClassifier()
    _, _, _, kind, names, correlation = builder._gpu[0]
    assert correlation.tolist() == ordered
    assert [builder.names.strings[n] for n in names.tolist()] == text
    assert kind.tolist() == [classify(rows[i][0], t) for i, t in zip(ordered, text)]
    assert builder.names.strings == list(dict.fromkeys([*earlier, *text, *sorted({cat for cat, _ in rows})]))


def _counting_loads(monkeypatch):
    from analyzer.rank import analysis
    calls = []
    real = analysis.load_rank_trace

    def load(path, *args):
        calls.append(str(path))
        return real(path, *args)

    monkeypatch.setattr(analysis, "load_rank_trace", load)
    monkeypatch.setattr(analysis, "_LAST_LOADED", {})
    return analysis, calls


GPU_RANK = Path(__file__).resolve().parent.parent / "sample_traces" / "gpu_h200" / "ddp"


def test_timeline_reuses_the_trace_just_loaded(monkeypatch, tmp_path):
    """The report's second look at a rank (keep_timeline, one step) takes the trace this process
    loaded for the map instead of decoding the file again, with the same result as a fresh
    read; the slot is emptied by that use."""
    analysis, calls = _counting_loads(monkeypatch)
    path = str(sorted(GPU_RANK.glob("*.json*"))[0])
    options = analysis.RankOptions()
    analysis.analyze_rank_file(path, options)
    step = analysis.analyze_rank_file(path, replace(options, keep_timeline=True, steps=None))
    assert calls == [path]
    assert not analysis._LAST_LOADED
    again = analysis.analyze_rank_file(path, replace(options, keep_timeline=True, steps=None))
    assert calls == [path, path]
    assert json.dumps(step.timeline, default=str) == json.dumps(again.timeline, default=str)
    assert step.collectives == again.collectives


def test_a_rewritten_file_is_read_again(monkeypatch, tmp_path):
    analysis, calls = _counting_loads(monkeypatch)
    source = sorted(GPU_RANK.glob("*.json*"))[0]
    path = tmp_path / source.name
    shutil.copy(source, path)
    analysis.analyze_rank_file(str(path), analysis.RankOptions())
    shutil.copy(source, tmp_path / "other")
    os.replace(tmp_path / "other", path)  # same bytes, a new file (inode and ctime change)
    analysis.analyze_rank_file(str(path), analysis.RankOptions())
    assert calls == [str(path), str(path)]


def _load_in_child(path: str, queue) -> None:
    from analyzer.rank import analysis
    analysis.analyze_rank_file(path, analysis.RankOptions())
    queue.put(len(analysis._LAST_LOADED))


def test_workers_keep_nothing_between_ranks():
    path = str(sorted(GPU_RANK.glob("*.json*"))[0])
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_load_in_child, args=(path, queue))
    child.start()
    kept = queue.get(timeout=120)
    child.join(timeout=60)
    assert kept == 0


def test_one_rank_map_imports_no_process_machinery():
    """A one-process run imports neither multiprocessing nor concurrent.futures (~20 ms, issue
    13): they are imported where a pool or the two-core helper starts. The one-slot trace cache
    still tells the main process from a worker."""
    import subprocess
    import sys
    code = ("import sys; from analyzer.rank import analysis; from analyzer.run import executors; "
            "print(analysis._main_process(), [m for m in ('multiprocessing', 'concurrent.futures', 'numpy.ma', "
            "'importlib.resources') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True []"


ARG_JSON = st.fixed_dictionaries({}, optional={
    "correlation": st.integers(0, 9), "External id": st.integers(0, 9), "stream": st.just(7),
    "Collective name": st.just("allreduce"), "Seq": st.one_of(st.integers(-1, 3), st.just("2")),
    "Comms Id": st.integers(0, 3), "Process Group Ranks": st.just("[0, 1]"), "dtype": st.just("Float"),
    "Input Dims": st.sampled_from([[], [[2, 3]], [[]]]), "Input type": st.just(["float"]),
})


@settings(max_examples=100, deadline=None)
@given(st.lists(ARG_JSON, max_size=12))
def test_comm_args_columns_of_decoded_events(decoded):
    """The one C-level pass that skips args without collective metadata (recorded shapes
    included: decoded events share the default Raw) keeps exactly the rows comm_args_of fills."""
    args = msgspec.json.decode(json.dumps(decoded).encode(), type=list[EventArgs])
    rows = np.arange(len(args)) * 3 + 1
    expected = {int(row): comm_args_of(a) for row, a in zip(rows, args) if comm_args_of(a)}
    assert comm_args_columns(args, rows) == expected

RAW = st.sampled_from([msgspec.Raw(b""), msgspec.Raw(b"[[2, 3]]"), msgspec.Raw(b'["float"]'), msgspec.Raw(b'["True"]')])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.builds(EventArgs, input_dims=RAW, input_type=RAW, concrete_inputs=RAW)),
                max_size=10))
def test_recorded_texts_by_column_are_each_ops(args):
    """The shape ops' recorded texts read in C-level passes are each op's own (b"" without args)."""
    from analyzer.ingest.shapes import _recorded_of, _recorded_texts
    events = [Event(name="aten::mm", args=a) for a in args]
    assert list(_recorded_texts(events)) == [_recorded_of(e) for e in events]
