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

import os
import sys
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from analyzer.base.errors import InputError
from analyzer.ingest.classify import DEFAULT_COMM_PATTERN, KernelClassifier
from analyzer.ingest.columns import ColumnBuilder
from analyzer.ingest.files import DEFAULT_MAX_INFLATE_BYTES, GZIP_MAGIC, iter_trace_chunks
from analyzer.ingest.loader import load_rank_trace, rank_trace_of
from analyzer.ingest.stream import (
    EVENTS_DECODER,
    MAX_EVENT_BYTES,
    Decoding,
    TooLong,
    advance,
    decode_final,
    events_slice,
    last_candidate_cut,
    read_head,
)
from analyzer.ingest.trace import RankTrace

if TYPE_CHECKING:  # imported where a helper starts: ~20 ms of every process that never starts one
    from concurrent.futures import Future, ProcessPoolExecutor

MIN_PARALLEL_BYTES = 96 << 20  # smaller traces: starting a process costs more than it saves
IN_FLIGHT = 2  # slices handed to the helper and not yet merged (bounds memory)
# Each slice costs a round trip to the helper, so slices are larger than the sequential
# loader's chunks (analyzer.ingest.files.CHUNK_BYTES), yet small enough that a slice's events
# stay in cache. Measured (issue 13), wall of a 510 MB rank / a 200 MB rank gzipped: 32 MB
# slices 4.1 / 1.8 s (slower than one process with 4 MB chunks: 3.4 / 1.4 s), 8 MB 2.4 / 1.3 s.
SLICE_BYTES = 8 << 20


def load_rank_trace_parallel(path: Path, comm_pattern: str = DEFAULT_COMM_PATTERN,
                             max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES,
                             chunk_bytes: int = SLICE_BYTES) -> RankTrace:
    """:func:`analyzer.ingest.loader.load_rank_trace` on two cores (same result)."""
    try:
        loaded = _load_two_way(path, comm_pattern, max_inflate_bytes, chunk_bytes)
    except TooLong:
        raise  # refused as soon as seen, by either loader: not read twice
    except (InputError, msgspec.MsgspecError, OSError, EOFError, RuntimeError):
        loaded = None  # the sequential loader reports the problem with all its care
    return loaded if loaded is not None else load_rank_trace(path, comm_pattern, max_inflate_bytes)


def build_slice_of_file(path: Path, offset: int, length: int, comm_pattern: str) -> dict[str, Any] | None:
    """:func:`build_slice` of ``length`` bytes at ``offset`` of an uncompressed trace, read
    straight into a bracketed buffer (one copy from the page cache, nothing through a pipe)."""
    data = bytearray(length + 2)
    data[0], data[-1] = ord("["), ord("]")
    with open(path, "rb") as handle:
        handle.seek(offset)
        if handle.readinto(memoryview(data)[1:-1]) != length:
            return None
    return build_slice(data, comm_pattern)


def build_slice(data: bytes | bytearray, comm_pattern: str) -> dict[str, Any] | None:
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
        from concurrent.futures import Future

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
    buf, array_at = read_head(chunks, path)
    if array_at is None or array_at < 0:
        return None
    head = bytes(buf[:array_at])
    with open(path, "rb") as handle:
        plain = handle.read(2) != GZIP_MAGIC
    merger = _Merger(builder)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=_context()) as helper:
        if plain:
            chunks.close()  # the file is read by offsets instead
            offset, tail = _slices_by_offset(path, array_at, chunk_bytes, merger, helper, comm_pattern)
        else:
            offset, tail = _slices_streamed(chunks, buf[array_at:], array_at, merger, helper, comm_pattern)
        merger.drain(0)
    if merger.failed or tail is None:
        return None
    state.events_seen = builder.event_count
    meta = decode_final(state, head + tail, head, offset, builder.add)
    return rank_trace_of(path, meta, builder, state)


def _slices_streamed(chunks, buf: bytes, offset: int, merger: _Merger, helper: ProcessPoolExecutor,
                     comm_pattern: str) -> tuple[int, bytes | None]:
    """Gzip: slices cut from the inflated stream, every other one piped to the helper; returns
    (offset of the tail in the JSON text, the tail: the last events and what follows them)."""
    turn = 0
    while not merger.failed:
        consumed = 0
        cut = last_candidate_cut(buf)
        if cut is not None:
            brace, after_comma = cut
            data = events_slice(buf, brace)
            merger.add(helper.submit(build_slice, data, comm_pattern) if turn % 2 == 0
                       else build_slice(data, comm_pattern))
            turn += 1
            consumed = after_comma
            offset += after_comma
            merger.drain(IN_FLIGHT)
        elif len(buf) > MAX_EVENT_BYTES:
            return offset, None
        chunk = next(chunks, None)
        if chunk is None:
            return offset, buf[consumed:]
        buf = advance(buf, consumed, chunk)
    return offset, None


def _slices_by_offset(path: Path, start: int, chunk_bytes: int, merger: _Merger, helper: ProcessPoolExecutor,
                      comm_pattern: str) -> tuple[int, bytes | None]:
    """Uncompressed: cut points found by reading only a window before each ``chunk_bytes``
    step; each process reads its own slices from the file (the page cache), so nothing is
    copied between them."""
    size = os.path.getsize(path)
    turn = 0
    with open(path, "rb") as handle:
        while not merger.failed and start + chunk_bytes < size:
            cut = _cut_before(handle, start, start + chunk_bytes)
            if cut is None:
                return start, None
            brace, after_comma = cut
            if turn % 2 == 0:
                merger.add(helper.submit(build_slice_of_file, path, start, brace + 1 - start, comm_pattern))
            else:
                merger.add(build_slice_of_file(path, start, brace + 1 - start, comm_pattern))
            turn += 1
            start = after_comma
            merger.drain(IN_FLIGHT)
        handle.seek(start)
        return start, handle.read()


def _cut_before(handle, start: int, stop: int) -> tuple[int, int] | None:
    """(file offset of the last event-closing brace before ``stop``, offset after its comma)."""
    window = 1 << 16
    while True:
        lo = max(start, stop - window)
        handle.seek(lo)
        cut = last_candidate_cut(handle.read(stop - lo))
        if cut is not None:
            return lo + cut[0], lo + cut[1]
        if lo == start or window > MAX_EVENT_BYTES:
            return None
        window *= 8


def _context():
    # Linux: fork, so the helper inherits the imported modules (no re-import). Elsewhere the
    # platform's default (spawn on macOS and Windows, where forking is unsafe or missing).
    import multiprocessing

    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
