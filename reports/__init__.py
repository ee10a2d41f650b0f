"""Renderers: a Result (or a diff / gate / what-if document) in, text out. Nothing here
analyses: every number drawn is already in the Result."""

from __future__ import annotations

from typing import Any, Iterator

from analyzer.job.result import VIEWS


def render(result: Any, fmt: str, timestamp: bool = False) -> str:
    """``result`` (a Result) as ``text``, ``json`` or ``html``. ``timestamp``: HTML shows the
    generation time (off by default so the bytes are reproducible)."""
    if fmt == "json":
        from analyzer.reports.json_report import JsonRenderer
        return JsonRenderer().render(result.to_dict())
    if fmt == "html":
        from datetime import datetime, timezone

        from analyzer.reports.html import HtmlRenderer
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if timestamp else None
        return HtmlRenderer(timestamp=stamp).render(result)
    from analyzer.reports.text import TextRenderer
    return TextRenderer().render(result)


def render_summary_html(result: Any) -> str:
    """Jupyter's inline view of a Result: verdict, headline numbers and findings (escaped)."""
    from analyzer.reports.html import SummaryHtmlRenderer
    return SummaryHtmlRenderer().render(result)


VIEWS.update({"html": lambda result: render(result, "html"), "summary-html": render_summary_html})


def render_chunks(result: Any, fmt: str, timestamp: bool = False) -> Iterator[str] | Iterator[bytes]:
    """``render`` in pieces: the JSON of a large job is streamed (the same bytes, UTF-8
    encoded), never held as one string."""
    if fmt == "json":
        return result.json_chunks()
    return iter([render(result, fmt, timestamp)])


def render_diff(doc: dict[str, Any], fmt: str) -> str:
    """A ``tracecliff diff`` document as text, json or html."""
    if fmt == "json":
        from analyzer.job.result import dumps
        return dumps(doc)
    if fmt == "html":
        from analyzer.reports.diff_html import DiffHtmlRenderer
        return DiffHtmlRenderer().render(doc)
    from analyzer.reports.diff_text import DiffTextRenderer
    return DiffTextRenderer().render(doc)
