"""The JSON view: the Result's document as ``diagnose --format json`` writes it."""

from __future__ import annotations

from typing import Any

from analyzer.job.result import dumps


class JsonRenderer:
    name = "json"

    def render(self, doc: dict[str, Any]) -> str:
        return dumps(doc)
