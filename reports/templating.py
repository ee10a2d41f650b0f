"""The one Jinja setup of every HTML page: templates beside this file, autoescape on (every
trace or dump string is untrusted), strict undefined, and ``|tojson`` with sorted keys, ASCII
only and no NaN, so U+2028/U+2029 arrive as escapes and jinja2 escapes < > & ' on top: no data
can close the script element it sits in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jinja2
from markupsafe import Markup

TEMPLATES = Path(__file__).resolve().parent / "templates"


def environment(filters: dict[str, Callable[..., Any]], compact_json: bool = False) -> jinja2.Environment:
    """A page's environment with its own filters (callers cache it). ``compact_json``: no
    blanks in ``|tojson`` output (the diagnosis report's timeline data is large)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    policy: dict[str, Any] = {"sort_keys": True, "ensure_ascii": True, "allow_nan": False}
    if compact_json:
        policy["separators"] = (",", ":")
    env.policies["json.dumps_kwargs"] = policy
    env.filters.update(filters)
    env.globals["asset"] = lambda name: Markup((TEMPLATES / name).read_text(encoding="utf-8"))
    return env


def stylesheet() -> Markup:
    """The report stylesheet, inlined by every page (no network)."""
    return Markup((TEMPLATES / "report.css").read_text(encoding="utf-8"))
