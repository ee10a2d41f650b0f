"""Progress on stderr for long work: only on an interactive terminal, never in CI or a pipe."""

from __future__ import annotations

import os
import sys

from analyzer.base.sanitize import one_line


def progress_enabled(stream=None) -> bool:
    """``stream`` None: the current ``sys.stderr`` (looked up now, not at import: it may have
    been replaced since, e.g. by a test runner's capture)."""
    if os.environ.get("CI") or os.environ.get("TRACECLIFF_NO_PROGRESS"):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class ProgressBar:
    def __init__(self, label: str, stream=None):
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(stream)

    def __call__(self, done: int, total: int, item: str) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(total, 1))
        name = os.path.basename(item)[-30:]
        name = one_line(name)  # a file name: shown, never obeyed by the terminal
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name:<30}")
        if done >= total:
            self.stream.write("\r" + " " * (width + 80) + "\r")
        self.stream.flush()
