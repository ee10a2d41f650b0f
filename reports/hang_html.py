"""Self-contained HTML view of ``tracecliff hang``: one file, no network, no script. Autoescape
is on (every dump string is untrusted) and the report's data travels in a JSON block written with
``|tojson``. The Jinja setup is reports/templating.py's, with the diff page's filters."""

from __future__ import annotations

from typing import Any

from analyzer.hang.words import call_text, clock, evidence_lines, pg_label
from analyzer.reports.diff_html import _environment
from analyzer.reports.templating import stylesheet
from analyzer.reports.hang_text import COMPLETION, STACK_DEPTH, same_culprits


def render_html(doc: dict[str, Any]) -> str:
    return _environment().get_template("hang.html.j2").render(
        doc=doc, css=stylesheet(), clock=clock, pg_label=pg_label, call_text=call_text,
        evidence_lines=evidence_lines, completion=COMPLETION, depth=STACK_DEPTH,
        same_culprits=same_culprits)
