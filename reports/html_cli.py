"""What ``diagnose`` needs for the HTML report: its options, and the document sections that only
the HTML view uses (the kernel timeline, the scaling what-if curve, the optional HTA deep dive).

These sections go into a copy of the JSON document handed to the renderer; ``--format json``
output is unchanged."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any

import click

from analyzer.reports.html import HtmlRenderer
from analyzer.reports.html_timeline import timeline_data


def html_options(command):
    """Click decorator adding --html, --step, --hta, --timestamp; the command receives them as
    one ``html`` dict."""

    @functools.wraps(command)
    def wrapper(*args, html_file, step, hta, timestamp, **kwargs):
        return command(*args, html={"file": html_file, "step": step, "hta": hta, "timestamp": timestamp}, **kwargs)

    options = [
        click.option("--html", "html_file", type=click.Path(dir_okay=False),
                     help="Also write the self-contained HTML report to FILE (next to the chosen --format)."),
        click.option("--step", type=int, help="ProfilerStep shown in the HTML timeline (default: the median step)."),
        click.option("--hta", is_flag=True,
                     help="HTML: add HTA's idle-time and kernel-type breakdowns (needs the optional hta extra)."),
        click.option("--timestamp", is_flag=True,
                     help="HTML: print the generation time (off by default so the bytes are reproducible)."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def wants_html(fmt: str, html: dict[str, Any]) -> bool:
    return fmt == "html" or bool(html.get("file"))


def html_document(doc: dict[str, Any], result: Any, html: dict[str, Any]) -> dict[str, Any]:
    """``doc`` plus the HTML-only sections, from the Result (whose ranks kept their timelines)."""
    out = dict(doc)
    out["timeline"] = timeline_data(result.ranks, doc, html.get("step"))
    scaling = scaling_data(result)
    if scaling is not None:
        out["scaling"] = scaling
    if html.get("hta"):
        from analyzer.hta_deepdive import deep_dive
        out["hta"] = deep_dive({int(i["rank"]): str(i["path"]) for i in doc.get("inputs") or []})
    return out


def render_html(doc: dict[str, Any], html: dict[str, Any]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if html.get("timestamp") else None
    return HtmlRenderer(timestamp=stamp).render(doc)


def scaling_data(result: Any) -> dict[str, Any] | None:
    """The what-if efficiency curve, when the what-if model is available (analyzer.whatif)."""
    try:
        from analyzer import whatif  # noqa: F401 - lands with the what-if issue
    except ImportError:
        return None
    builder = getattr(whatif, "scaling_curve", None)
    if builder is None:
        return None
    try:
        return builder(result)
    except Exception as exc:  # noqa: BLE001 - one section must not fail the report
        return {"available": False, "why": f"what-if projection failed: {type(exc).__name__}: {exc}"}
