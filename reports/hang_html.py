"""Self-contained HTML view of ``tracecliff hang``: one file, no network, no script. Autoescape
is on (every dump string is untrusted) and the report's data travels in a JSON block written with
``|tojson``. The Jinja environment and stylesheet are the diff report's (same options)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from analyzer.hang import call_text, clock, group_label
from analyzer.reports.diff_html import TEMPLATES, _environment
from analyzer.reports.hang_text import COMPLETION, STACK_DEPTH


def render_html(doc: dict[str, Any]) -> str:
    css_file = TEMPLATES / "report.css"
    css = css_file.read_text(encoding="utf-8") if css_file.is_file() else ""
    return _environment().get_template("hang.html.j2").render(
        doc=doc, css=Markup(css), clock=clock, group_label=group_label, call_text=call_text,
        completion=COMPLETION, depth=STACK_DEPTH)
