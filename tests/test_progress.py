"""The progress bar: only on an interactive terminal, never in CI or a pipe, never a crash."""

import io
import sys

from analyzer.base.progress import ProgressBar, progress_enabled


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file.")  # as real files do
        return True


def test_draws_on_a_terminal_and_clears_at_the_end(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TRACECLIFF_NO_PROGRESS", raising=False)
    screen = Terminal()
    bar = ProgressBar("reading traces", screen)
    bar(1, 2, "/x/rank-0.json")
    assert "reading traces [" in screen.getvalue() and "1/2 rank-0.json" in screen.getvalue()
    bar(2, 2, "/x/rank-1.json")
    assert screen.getvalue().endswith("\r")


def test_quiet_in_ci_in_a_pipe_and_on_a_closed_stream(monkeypatch):
    monkeypatch.delenv("TRACECLIFF_NO_PROGRESS", raising=False)
    monkeypatch.setenv("CI", "true")
    assert not progress_enabled(Terminal())
    monkeypatch.delenv("CI")
    assert progress_enabled(Terminal())
    assert not progress_enabled(io.StringIO())  # a pipe or file
    closed = Terminal()
    closed.close()
    assert not progress_enabled(closed)
    monkeypatch.setenv("TRACECLIFF_NO_PROGRESS", "1")
    assert not progress_enabled(Terminal())


def test_default_stream_is_stderr_at_call_time(monkeypatch):
    """Not the stderr of import time: a replaced stderr (a test runner, a library user's
    redirect) must be the one used."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TRACECLIFF_NO_PROGRESS", raising=False)
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    bar = ProgressBar("reading traces")
    assert bar.enabled and bar.stream is screen
