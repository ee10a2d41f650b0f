"""Self-contained HTML view of ``tracecliff whatif`` (a Projection's dict, or a ``--fix-ranks``
replay's): one file, no network, no script, autoescaped (reports/templating.py). It draws the
same rows as the text view (reports/whatif_text.py), which computes nothing either."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from analyzer.reports.templating import environment, stylesheet
from analyzer.reports.whatif_text import assumption_lines, figure_rows, replay_sentence, title


def render_html(doc: dict[str, Any]) -> str:
    """A projection, or (with ``ranks``) a replay of the measured job with those ranks fixed."""
    if "ranks" in doc and "projected" not in doc:
        return _environment().get_template("whatif.html.j2").render(
            css=stylesheet(), title=replay_sentence(doc), rows=[], compute="", assumptions=[], notes=[], warnings=[])
    model = doc["projected"].get("compute_model")
    compute = (f"Compute at {model['factor']:g}x the work per GPU (strong scaling): measured "
               f"{model['measured_us']:,.0f} µs, perfect scaling {model['perfect_scaling_us']:,.0f} µs, at the "
               f"efficiency measured per shape {model['projected_us']:,.0f} µs") if model else ""
    return _environment().get_template("whatif.html.j2").render(
        css=stylesheet(), title=title(doc), rows=figure_rows(doc), compute=compute,
        assumptions=assumption_lines(doc["assumptions"]), notes=doc.get("notes") or [],
        warnings=doc.get("warnings") or [])


@lru_cache(maxsize=1)
def _environment():
    return environment({})
