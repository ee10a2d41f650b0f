"""Atomic output files: write a temporary file beside the target, then rename over it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

from analyzer.base.errors import InputError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # once, at import: os.umask is process-wide, not thread-safe


def write_atomic(path: str | Path, text: str | bytes | memoryview | Iterable[str | bytes],
                 inputs: list[str] | None = None) -> None:
    """Write ``text`` (or its pieces, in order: a large result is never held as one string) to
    ``path`` through a temporary file renamed over it; never over one of ``inputs``."""
    target = Path(path)
    for given in inputs or []:
        if target.exists() and Path(given).exists() and os.path.samefile(target, given):
            raise InputError(target, "refusing to overwrite an input trace")
    pieces = [text] if isinstance(text, (str, bytes, memoryview)) else text
    if _is_special(target):  # /dev/null, /dev/stdout, a pipe: write through, never rename over it
        try:
            with open(target, "wb") as handle:
                _write_pieces(handle, pieces)
        except OSError as exc:
            raise InputError(target, f"cannot write: {exc.strerror or exc}") from None
        return
    import tempfile  # only for a file written in place (~2 ms of imports a run to stdout or /dev/null need not pay)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(target, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            _write_pieces(handle, pieces)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, target)
    except OSError as exc:
        os.unlink(tmp)
        raise InputError(target, f"cannot write: {exc.strerror or exc}") from None


def _write_pieces(handle, pieces: Iterable[str | bytes]) -> None:
    for piece in pieces:
        handle.write(piece.encode("utf-8") if isinstance(piece, str) else piece)


def is_special(target: str | Path) -> bool:
    """Whether ``target`` is a device, FIFO or socket (``/dev/stdout``, ``/dev/null``, a pipe)."""
    return _is_special(Path(target))


def _is_special(target: Path) -> bool:
    """An existing target that is not a regular file (a device, FIFO or socket): replacing it
    with a renamed file would, as root, turn /dev/null into a plain file."""
    try:
        return not stat.S_ISREG(os.stat(target).st_mode)
    except OSError:
        return False
