"""One large trace on two cores: the events array's slices are decoded and turned into column
batches alternately in a helper process and in this one, then merged in file order.

Decoding is most of a rank's cost and a job of one rank would leave the other cores idle. The
slices are cut exactly as the streaming loader cuts them (:mod:`analyzer.ingest.stream`), each
is decoded and reduced to column batches on its own (:meth:`ColumnBuilder.export`), and the
batches are merged in order (:meth:`ColumnBuilder.merge`), which gives the same RankTrace,
string tables included, as the sequential loader.

A slice is handed out before the previous ones are known to be good. Anything but plain,
well-formed events (a cut inside a string, NaN literals, invalid UTF-8, the array closing, a
damaged file) sends the whole file back to the sequential loader, which handles and reports
each of those: the rare file pays twice, the common one half.
"""

from __future__ import annotations

import multiprocessing
import re
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from analyzer.errors import InputError
from analyzer.ingest.classify import DEFAULT_COMM_PATTERN, KernelClassifier
from analyzer.ingest.columns import ColumnBuilder
from analyzer.ingest.files import CHUNK_BYTES, DEFAULT_MAX_INFLATE_BYTES, iter_trace_chunks
from analyzer.ingest.loader import load_rank_trace, rank_trace_of
from analyzer.ingest.stream import (
    EVENTS_DECODER,
    MAX_EVENT_BYTES,
    Decoding,
    decode_final,
    events_slice,
    last_candidate_cut,
    read_head,
)
from analyzer.trace import RankTrace

# A comma between two objects: events are separated so; a nested object inside an event is
# mostly followed by another key (`}, "key"`), which the streaming loader's looser candidate
# (`},`) cannot tell from a boundary and then resolves with a slow exact scan.
_EVENT_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,(?=[ \t\r\n]*\{)")
MIN_PARALLEL_BYTES = 96 << 20  # smaller traces: starting a process costs more than it saves
IN_FLIGHT = 2  # slices handed to the helper and not yet merged (bounds memory)


def load_rank_trace_parallel(path: Path, comm_pattern: str = DEFAULT_COMM_PATTERN,
                             max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES,
                             chunk_bytes: int = CHUNK_BYTES) -> RankTrace:
    """:func:`analyzer.ingest.loader.load_rank_trace` on two cores (same result)."""
    try:
        loaded = _load_two_way(path, comm_pattern, max_inflate_bytes, chunk_bytes)
    except (InputError, msgspec.MsgspecError, OSError, EOFError, RuntimeError):
        loaded = None  # the sequential loader reports the problem with all its care
    return loaded if loaded is not None else load_rank_trace(path, comm_pattern, max_inflate_bytes)


def build_slice(data: bytes, comm_pattern: str) -> dict[str, Any] | None:
    """One slice (``[event, ...]``) decoded and reduced to column batches; None when it is not
    plain well-formed events (the sequential loader then takes the file)."""
    try:
        events = EVENTS_DECODER.decode(data)
    except msgspec.MsgspecError:
        return None
    builder = ColumnBuilder(KernelClassifier(comm_pattern))
    builder.add(events)
    return builder.export()


class _Merger:
    """Slice results in file order, merged into one builder as soon as they are ready."""

    def __init__(self, builder: ColumnBuilder) -> None:
        self.builder = builder
        self.pending: deque[Future | dict | None] = deque()
        self.failed = False

    def add(self, result: Future | dict | None) -> None:
        self.pending.append(result)

    def drain(self, keep: int) -> None:
        """Merge finished results from the front, waiting while more than ``keep`` are pending."""
        while self.pending:
            head = self.pending[0]
            if isinstance(head, Future) and len(self.pending) <= keep and not head.done():
                return
            self.pending.popleft()
            part = head.result() if isinstance(head, Future) else head
            if part is None:
                self.failed = True
            elif not self.failed:
                self.builder.merge(part)


def _load_two_way(path: Path, comm_pattern: str, max_inflate_bytes: int, chunk_bytes: int) -> RankTrace | None:
    builder = ColumnBuilder(KernelClassifier(comm_pattern))
    state = Decoding(path)
    chunks = iter_trace_chunks(path, max_inflate_bytes, chunk_bytes)
    buf, array_at = read_head(chunks)
    if array_at is None or array_at < 0:
        return None
    head = bytes(buf[:array_at])
    del buf[:array_at]
    offset = array_at
    merger = _Merger(builder)
    with ProcessPoolExecutor(max_workers=1, mp_context=_context()) as helper:
        turn = 0
        while not merger.failed:
            cut = last_candidate_cut(buf, _EVENT_BOUNDARY)
            if cut is not None:
                brace, after_comma = cut
                data = events_slice(buf, brace)
                merger.add(helper.submit(build_slice, data, comm_pattern) if turn % 2 == 0
                           else build_slice(data, comm_pattern))
                turn += 1
                del buf[:after_comma]
                offset += after_comma
                merger.drain(IN_FLIGHT)
            elif len(buf) > MAX_EVENT_BYTES:
                return None
            chunk = next(chunks, None)
            if chunk is None:
                break
            buf += chunk
        merger.drain(0)
    if merger.failed:
        return None
    state.events_seen = builder.event_count
    meta = decode_final(state, head + bytes(buf), head, offset, builder.add)
    return rank_trace_of(path, meta, builder, state)


def _context():
    # fork: the helper inherits the imported modules (no re-import); elsewhere the default.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)
