"""Find trace files and read their bytes (gzip sniffed by magic number, inflation capped)."""

from __future__ import annotations

import glob
import os
import zlib
from pathlib import Path

from analyzer.errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz")
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_INFLATE_BYTES = 8 * 10**9  # gzip-bomb guard; configurable

try:  # ISA-L inflates ~3x faster than zlib; optional so a pure-pip fallback always works.
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a declared dependency
    _zlib = zlib


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def discover_trace_files(paths: list[str] | tuple[str, ...]) -> list[Path]:
    """Expand files, directories (every ``*.json``/``*.json.gz`` inside) and globs, sorted."""
    if not paths:
        raise InputError("<arguments>", "no trace path given")
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.is_file() and is_trace_name(p.name))
            if not inside:
                raise InputError(path, "directory holds no trace files (*.json, *.json.gz)")
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


def read_trace_bytes(path: Path, max_inflate_bytes: int = DEFAULT_MAX_INFLATE_BYTES) -> bytes:
    """Return the JSON text of ``path``, inflating gzip whatever the file name says."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if not data:
        raise InputError(path, "empty file")
    if data[:2] == GZIP_MAGIC:
        return _inflate(path, data, max_inflate_bytes)
    return data


def _inflate(path: Path, data: bytes, cap: int) -> bytes:
    """Inflate every gzip member, refusing to grow past ``cap`` bytes (gzip bombs)."""
    out: list[bytes] = []
    total = 0
    inflater = _zlib.decompressobj(16 + _zlib.MAX_WBITS)
    pending: bytes = data
    try:
        while True:
            # max_length bounds each step, so a bomb is stopped after cap+1 bytes, not at OOM.
            piece = inflater.decompress(pending, cap - total + 1)
            total += len(piece)
            if total > cap:
                raise InputError(path, f"inflates past the {cap:,}-byte limit (gzip bomb?)")
            out.append(piece)
            pending = inflater.unconsumed_tail
            if inflater.eof:
                rest = inflater.unused_data
                if rest[:2] != GZIP_MAGIC:
                    break  # trailing bytes after the last member are ignored, as gzip does
                inflater, pending = _zlib.decompressobj(16 + _zlib.MAX_WBITS), rest
            elif not pending:
                raise InputError(path, "truncated gzip file (compressed data ends early)")
    except (zlib.error, OSError, EOFError) as exc:
        raise InputError(path, f"corrupt gzip data ({exc})") from None
    return b"".join(out)


def file_identity(path: Path) -> str:
    """Display name used in errors and outputs (as given, not resolved)."""
    return os.fspath(path)
