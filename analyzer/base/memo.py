"""Values derived from an object, computed on first use and kept with it: the one memo pattern.

A Result is built once and then frozen (analyzer.job.result): what the views derive from it
(the collective rows as columns, the digest of the rows, the job model, the what-if replayer and
projections) is computed when first asked for and kept in the object's private ``_memo`` slot,
which the freeze allows. Each value is kept with the objects it was derived from (``of``) and
made again when one of them is no longer the same object (by identity: a Result whose
collective rows were replaced gets a new view of them, never the old one's figures).

``memo(owner, name, build, *of)`` is the value; ``seed`` keeps one made elsewhere (the reduce's
columns); ``held`` says whether one is kept, without making it."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

_T = TypeVar("_T")
SLOT = "_memo"


def _slots(owner: Any) -> dict[str, tuple[tuple[Any, ...], Any]]:
    slots = vars(owner).get(SLOT)
    if slots is None:
        slots = vars(owner)[SLOT] = {}  # the object's own dict: no __setattr__, a frozen object allows it
    return slots


def memo(owner: Any, name: str, build: Callable[[], _T], *of: Any,
         valid: Callable[[_T], bool] | None = None) -> _T:
    """``owner``'s derived value ``name``: the one kept, if it was made from the very objects
    ``of`` (and ``valid`` holds of it, when given), else ``build()``, kept."""
    entry = vars(owner).get(SLOT, {}).get(name)
    if entry is not None and _same(entry[0], of) and (valid is None or valid(entry[1])):
        return entry[1]
    value = build()
    _slots(owner)[name] = (of, value)
    return value


def seed(owner: Any, name: str, value: Any, *of: Any) -> None:
    """Keep ``value`` as ``owner``'s ``name``, made from ``of`` (as ``memo`` would have)."""
    _slots(owner)[name] = (of, value)


def held(owner: Any, name: str) -> bool:
    """Whether ``owner`` keeps a value ``name`` (made or seeded), whatever it was made from."""
    return name in vars(owner).get(SLOT, {})


def _same(kept: tuple[Any, ...], given: tuple[Any, ...]) -> bool:
    return len(kept) == len(given) and all(a is b for a, b in zip(kept, given))
