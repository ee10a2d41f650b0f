"""tracecliff: explain distributed-training scaling cliffs from PyTorch profiler traces.

Data flows one way: ``ingest`` (files -> RankTrace) -> analyses (``timeline``, ``comms``, ...)
-> ``Result`` -> ``rules`` (findings) -> ``reports`` (text, json, html).
"""

import os as _os

__version__ = "0.1.0"

# Installed, the top-level rules/ and reports/ folders live inside this package (pyproject's
# package-dir). From a source checkout (``python -m analyzer`` or ``python -m pytest`` in the
# repo root put the checkout first on sys.path), let ``analyzer.rules`` / ``analyzer.reports``
# resolve to those same folders.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "rules")) and _os.path.isfile(
        _os.path.join(_checkout, "rules", "__init__.py")):
    __path__.append(_checkout)
