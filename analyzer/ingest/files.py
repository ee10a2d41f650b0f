"""Find trace files and read their bytes (gzip sniffed by magic number, inflation capped)."""

from __future__ import annotations

import glob
import zlib
from pathlib import Path
from typing import Iterator

from analyzer.base.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_INFLATE_BYTES = 8 * 10**9  # gzip-bomb guard; configurable
# Inflated bytes handed on at a time (streaming ingest). Small: a batch's decoded events then
# stay in cache and a rank's peak is a few MB of text plus the columns (the measurement behind
# it: docs/scale.md, "Constants and the measurements behind them").
CHUNK_BYTES = 4 << 20
READ_BYTES = 4 << 20  # file bytes read at a time

try:  # ISA-L inflates faster than zlib (docs/scale.md); optional so a pure-pip fallback always works.
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a declared dependency
    _zlib = zlib
_GZIP_ERRORS = tuple({zlib.error, _zlib.error, OSError, EOFError})


# JSON files that sit beside traces by design and are never one (analyzer.synth writes the
# job's truth.json with its ranks): left out of a directory without a warning, when not a trace.
COMPANION_FILES = frozenset({"truth.json"})


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def discover_trace_files(paths: list[str] | tuple[str, ...], skipped: list[Path] | None = None) -> list[Path]:
    """Expand files, directories (every ``*.json``/``*.json.gz`` inside that looks like a trace)
    and globs, sorted. Files named on purpose (directly or by a glob) are always taken: a bad
    one is an error. In a directory, JSON files that are not traces (a saved result, a config)
    are left out and listed in ``skipped``; a generator's ``truth.json`` is left out unlisted."""
    if not paths:
        raise InputError("<arguments>", "no trace path given")
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            named = sorted(p for p in path.iterdir() if p.is_file() and is_trace_name(p.name))
            inside = [p for p in named if looks_like_trace(p)]
            if skipped is not None:  # a generator's truth.json beside its traces is no trace by name: not warned of
                skipped.extend(p for p in named if p not in inside and p.name not in COMPANION_FILES)
            if not inside:
                raise InputError(path, "directory holds no trace files (*.json, *.json.gz with traceEvents)")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        elif glob.has_magic(raw):
            matches = sorted(Path(m) for m in glob.glob(raw) if Path(m).is_file())
            if not matches:
                raise InputError(raw, "pattern matches no files")
            found.extend(matches)
        elif path.exists():
            raise InputError(path, "not a regular file or directory")
        else:
            raise InputError(path, "no such file or directory")
    unique = sorted({p.resolve(): p for p in found}.values(), key=lambda p: str(p))
    return unique


SNIFF_BYTES = 1 << 20


def looks_like_trace(path: Path) -> bool:
    """Does the file look like a Chrome/Kineto trace? (an object whose ``traceEvents`` array
    opens, however long the metadata before it, or a bare JSON array). Streamed to the array
    (at most the reader's own limit on the text before it), never parsed. Unreadable, damaged
    or over-long files count as traces, so that reading them reports the problem instead of
    silently leaving a rank out."""
    from analyzer.ingest.stream import HEAD_LIMIT, ArrayFinder

    finder, buf = ArrayFinder(), b""
    try:
        for chunk in iter_trace_chunks(path, chunk_bytes=SNIFF_BYTES):
            buf += chunk
            found = finder.feed(buf)
            if found is not None:
                return found >= 0 or b'"traceEvents"' in buf
            if len(buf) > HEAD_LIMIT:
                return True
    except InputError:
        return True
    return b'"traceEvents"' in buf or buf.lstrip()[:1] == b"["


def read_trace_bytes(path: Path, max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES,
                     limit: int | None = None) -> bytes:
    """Return the JSON text of ``path``, inflating gzip whatever the file name says. ``limit``:
    a file whose text is longer is refused as soon as it passes it (a reader that needs the
    whole text: memory follows the limit, not what a small .gz inflates to)."""
    parts, size = [], 0
    for chunk in iter_trace_chunks(path, max_inflate_bytes):
        size += len(chunk)
        if limit is not None and size > limit:
            raise InputError(path, f"longer than {limit:,} bytes (inflated): no file of this kind is")
        parts.append(chunk)
    return b"".join(parts)


def iter_trace_chunks(path: Path, max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES,
                      chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The JSON text of ``path`` in pieces of at most ``chunk_bytes``: memory stays bounded by
    the chunk, not the file (gzip sniffed by magic number, inflation capped)."""
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        first = _read(path, handle, min(READ_BYTES, chunk_bytes))
        if not first:
            raise InputError(path, "empty file")
        if first[:2] == GZIP_MAGIC:
            yield from _inflate(path, handle, first, max_inflate_bytes, chunk_bytes)
            return
        yield first
        while block := _read(path, handle, chunk_bytes):
            yield block


def _read(path: Path, handle, size: int) -> bytes:
    try:
        return handle.read(size)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def _inflate(path: Path, handle, data: bytes, cap: int, chunk_bytes: int) -> Iterator[bytes]:
    """Inflate every gzip member, refusing to grow past ``cap`` bytes (gzip bombs)."""
    total = 0
    inflater = _zlib.decompressobj(16 + _zlib.MAX_WBITS)
    pending, file_done = data, False
    try:
        while True:
            if not pending and not file_done:
                pending = _read(path, handle, READ_BYTES)
                file_done = not pending
            # max_length bounds each step, so a bomb is stopped after cap+1 bytes, not at OOM.
            piece = inflater.decompress(pending, min(chunk_bytes, cap - total + 1))
            pending = inflater.unconsumed_tail
            total += len(piece)
            if total > cap:
                raise InputError(path, f"inflates past the {cap:,}-byte limit (gzip bomb? raise it with "
                                       "--max-inflate-gb)")
            if piece:
                yield piece
            if inflater.eof:
                rest = inflater.unused_data
                if len(rest) < 2 and not file_done:
                    more = _read(path, handle, READ_BYTES)
                    file_done, rest = not more, rest + more
                if rest[:2] != GZIP_MAGIC:
                    break  # trailing bytes after the last member are ignored, as gzip does
                inflater, pending = _zlib.decompressobj(16 + _zlib.MAX_WBITS), rest
            elif file_done and not pending and not piece:
                raise InputError(path, "truncated gzip file (compressed data ends early)")
    except _GZIP_ERRORS as exc:
        raise InputError(path, f"corrupt gzip data ({exc})") from None
    if total == 0:
        raise InputError(path, "empty file (the gzip data inflates to nothing)")
