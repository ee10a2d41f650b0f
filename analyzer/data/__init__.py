"""Data files shipped with the analyzer (the communication-kernel catalog, hardware profiles)."""

from __future__ import annotations

import pkgutil


def text(name: str) -> str:
    """One data file's text. pkgutil, not importlib.resources: the same bytes without ~5 ms of
    imports in every process (issue 13)."""
    data = pkgutil.get_data(__name__, name)
    assert data is not None  # a regular package: its loader reads files
    return data.decode("utf-8")
