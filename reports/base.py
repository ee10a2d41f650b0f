"""The one small interface every renderer implements: a Result (dict form) in, text out."""

from __future__ import annotations

from typing import Any, Protocol


class Renderer(Protocol):
    name: str

    def render(self, doc: dict[str, Any]) -> str: ...
