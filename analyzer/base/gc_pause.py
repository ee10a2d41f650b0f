"""Pause Python's cyclic garbage collector around allocation-heavy work.

A 64-rank job holds a few hundred thousand collective rows (small dicts and lists) and creates
no reference cycles; with the collector on, every few thousand allocations it re-scans all of
them, which cost a third of a cached 64-rank run. Reference counting still frees everything;
cycles made while paused are collected when the collector is back on.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc(long_lived: bool = False) -> Iterator[None]:
    """``long_lived``: what the block made lives to the end of the run (a job's summaries);
    move it to the oldest generation unscanned. Else the first collection after the pause
    scans every object made in it (over a second for a 64-rank job's 274,560 cached rows), and
    the next ones again; the oldest generation is scanned only when it has grown by a quarter."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if long_lived:
            gc.freeze()  # every tracked object to the permanent generation...
            gc.unfreeze()  # ...and back into the oldest one: a promotion without a scan
        if was_enabled:
            gc.enable()
