"""Errors that the CLI turns into one line on stderr and exit code 2 (never a traceback)."""

from __future__ import annotations


class TracecliffError(Exception):
    """Base class of every error tracecliff reports to the user as one line."""


class InputError(TracecliffError):
    """A trace file (or path) that cannot be used. The message names the file and the problem."""

    def __init__(self, path: object, problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause said
        super().__init__(f"{self.path}: {self.problem}")

    def __reduce__(self):
        # Rebuilt from (path, problem) when it crosses a process boundary (worker pools, Dask).
        return (type(self), (self.path, self.problem))


class ConfigError(TracecliffError):
    """A bad option or configuration value (unknown metric, rule, threshold...)."""
