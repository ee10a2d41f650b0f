"""The communication-kernel catalog (``analyzer/data/comm_kernels.toml``): which GPU kernels
move bytes between ranks, which library issued them and, where the name tells it, the collective.

The catalog's patterns and the user's (``--comm-kernel``, ``[tool.tracecliff.communication]``)
join into one regular expression that the classifier runs once per unique kernel name; the
library and collective of a kernel are looked up, again once per unique name, when its
collective row is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from analyzer import data

USER_LIBRARY = "user"  # kernels counted as communication only through a user pattern


@dataclass(frozen=True)
class CommKernel:
    id: str
    library: str
    pattern: str
    collective: str | None  # fixed by the name; None: from the CPU op or the NCCL name
    generic: bool  # the name tells nothing of the collective (NCCL's generic kernels)
    example: str
    note: str


@lru_cache(maxsize=1)
def catalog() -> tuple[CommKernel, ...]:
    text = data.text("comm_kernels.toml")
    return tuple(CommKernel(e["id"], e["library"], e["pattern"], e.get("collective"), bool(e.get("generic")),
                            e.get("example", ""), e.get("note", ""))
                 for e in tomllib.loads(text)["kernel"])


def comm_pattern(extra: tuple[str, ...] = ()) -> str:
    """One regular expression (searched case-insensitively) matching the catalog's kernels and
    the user's ``extra`` patterns."""
    return "|".join(f"(?:{p})" for p in (*(k.pattern for k in catalog()), *extra))


DEFAULT_COMM_PATTERN = comm_pattern()


@lru_cache(maxsize=65536)
def lookup(name: str) -> CommKernel | None:
    """The first catalog entry matching a kernel name (None: only a user pattern matched)."""
    for kernel in _compiled():
        if kernel[0].search(name):
            return kernel[1]
    return None


@lru_cache(maxsize=1)
def _compiled() -> tuple[tuple[re.Pattern, CommKernel], ...]:
    return tuple((re.compile(k.pattern, re.IGNORECASE), k) for k in catalog())
