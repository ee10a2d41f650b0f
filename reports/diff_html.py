"""Self-contained HTML view of ``tracecliff diff``: one file, no network, no script, in the
diagnosis report's style (its stylesheet is inlined when installed). Autoescape is on and the
diff's data travels in a JSON block written with ``|tojson``, so no trace string can open a tag.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from analyzer.base.units import fmt_change, fmt_flops, fmt_tflops
from analyzer.reports.diff_text import SCOPE, fmt, pct, scope_label, signed
from analyzer.job.result import _clean
from analyzer.reports.templating import environment, stylesheet


class DiffHtmlRenderer:
    name = "html"

    def render(self, doc: dict[str, Any]) -> str:
        doc = _clean(doc)
        return _environment().get_template("diff.html.j2").render(
            doc=doc, css=stylesheet(), rows=_decomposition_rows(doc["step_time"]), scope=SCOPE)


def _decomposition_rows(step: dict[str, Any]) -> list[dict[str, Any]]:
    """Components and their parts, with a bar width (% of the largest |Δ|) for the chart."""
    if not step.get("available"):
        return []
    rows = []
    for c in step["components"]:
        rows.append({**c, "depth": 0})
        rows += [{**p, "depth": 1} for p in c.get("parts", []) if p["base_us"] or p["new_us"]]
    largest = max((abs(r["delta_us"]) for r in rows), default=0.0) or 1.0
    for r in rows:
        r["bar_pct"] = round(100.0 * abs(r["delta_us"]) / largest, 2)
    return rows


@lru_cache(maxsize=1)
def _environment():
    return environment({"fmt": fmt, "pct": pct, "change": lambda pct_, pp: fmt_change(pp, pct_), "signed": signed, "scope_label": scope_label, "flops": fmt_flops,
                        "tflops": fmt_tflops})
