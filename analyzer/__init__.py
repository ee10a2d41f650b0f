"""tracecliff: explain distributed-training scaling cliffs from PyTorch profiler traces.

Data flows one way: ``ingest`` (files -> RankTrace) -> analyses (``timeline``, ``comms``, ...)
-> ``Result`` -> ``rules`` (findings) -> ``reports`` (text, json, html).
"""

import os as _os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Installed, the top-level rules/ and reports/ folders live inside this package (pyproject's
# package-dir). From a source checkout (``python -m analyzer`` or ``python -m pytest`` in the
# repo root put the checkout first on sys.path), let ``analyzer.rules`` / ``analyzer.reports``
# resolve to those same folders.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "rules")) and _os.path.isfile(
        _os.path.join(_checkout, "rules", "__init__.py")):
    __path__.append(_checkout)

# The library API, imported on first use (module __getattr__, PEP 562): `import analyzer` stays
# cheap (no numpy, pandas or msgspec) and `analyzer.capture` imports without the analysis stack.
_EXPORTS = {
    "diagnose": "analyzer.api", "load_result": "analyzer.api", "load_run": "analyzer.api",
    "DiagnoseOptions": "analyzer.api", "Result": "analyzer.api", "Finding": "analyzer.job.result",
    "load_config": "analyzer.base.config", "result_schema": "analyzer.api", "config_schema": "analyzer.api",
}
__all__ = ["__version__", "DiagnoseOptions", "Finding", "Result", "config_schema", "diagnose", "load_config",
           "load_result", "load_run", "result_schema"]  # = _EXPORTS (tests/test_api.py checks)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from analyzer.api import DiagnoseOptions, Result, config_schema, diagnose, load_result, load_run, result_schema
    from analyzer.base.config import load_config
    from analyzer.job.result import Finding


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cached: the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
