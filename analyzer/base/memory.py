"""Hand freed heap memory back to the operating system.

CPython frees a large block (a numpy array, a long list) to the C allocator, which keeps it for
reuse; while longer-lived objects sit above it, the pages stay resident. glibc's
``malloc_trim(0)`` returns every such free page (``madvise``), so a short-lived peak does not
stay in the process's resident size for the rest of the run.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any


def release_free_memory() -> None:
    """``malloc_trim(0)`` where the C library is glibc; nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only where it is used: ~2 ms of import

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl (Alpine) has no libc.so.6 / no malloc_trim
        return None
