"""A rule's evidence as a type: each rule declares a ``msgspec.Struct`` (frozen, unknown fields
forbidden, its fields in the order the rule writes them), and each field's label and unit live in
its annotation, e.g. ``t_comm_us: Annotated[Us, label("communication time")]``. The views render
a finding's evidence from its rule's type (``evidence_spec``), never from a key's spelling; the
global table ``analyzer.rules.evidence_fields.FIELDS`` is only the fallback for a rule with no type
yet (and for a saved result of a rule that no longer exists).

Types only: this module imports no analysis (the views import it). The unit aliases: ``Us`` µs,
``Bytes``, ``Gbps`` GB/s, ``Pct`` a percentage, ``Share`` a fraction shown as %, ``Mb`` MB,
``Tflops`` TFLOP/s, ``Count`` a count or plain number, ``Flag`` yes/no, ``Text``. A mapping keyed
by data (a rank, a step, a collective) is ``Annotated[dict[str, Us], label(...), keys("rank")]``
(its values' unit from the value type); ``[key, {inner: value}]`` pairs add ``inner("rank")``; a
list of rows gives each position's heading and unit with ``columns((heading, unit), ...)``.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from analyzer.rules.evidence_fields import Field

__all__ = ["UNSET", "UnsetType", "Meta", "Us", "Bytes", "Gbps", "Pct", "Share", "Mb", "Tflops", "Count",
           "Flag", "Text", "label", "keys", "inner", "columns", "Evidence", "FixCheck", "RankStepRef", "AlphaBetaLink",
           "FixMemory", "FindingEvidence",
           "evidence_spec", "evidence_type", "evidence_dict", "register_evidence", "ENGINE_KEYS"]


def _unit(unit: str) -> Meta:
    return Meta(extra={"unit": unit})


Us = Annotated[Union[float, None], _unit("us")]
Bytes = Annotated[Union[float, None], _unit("bytes")]
Gbps = Annotated[Union[float, None], _unit("gbps")]
Pct = Annotated[Union[float, None], _unit("pct")]
Share = Annotated[Union[float, None], _unit("share")]
Mb = Annotated[Union[float, None], _unit("mb")]
Tflops = Annotated[Union[float, None], _unit("tflops")]
Count = Union[float, None]  # a count or a plain number: no unit
Flag = Union[bool, None]
Text = Annotated[Union[str, None], _unit("text")]


def label(text: str) -> Meta:
    """A field's heading."""
    return Meta(extra={"label": text})


def keys(kind: str) -> Meta:
    """A mapping keyed by data: what its keys are ("rank", "step", "collective")."""
    return Meta(extra={"keys": kind})


def inner(kind: str) -> Meta:
    """``[key, {inner: value}]`` pairs: what the inner mapping's keys are."""
    return Meta(extra={"inner": kind})


def columns(*cols: tuple[str, str | None]) -> Meta:
    """Rows as lists: each position's heading and unit."""
    return Meta(extra={"columns": tuple(cols)})


class Evidence(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The base of every rule's evidence type (a Struct of its own fields, in the order it writes them)."""


class FixCheck(Evidence, frozen=True, forbid_unknown_fields=True):
    """One fix a finding suggests and its preconditions (rules.engine.RuleContext._fixes)."""

    fix: Annotated[Text, label("fix")]
    requires: Annotated[list[str], label("requires")]
    printed: Annotated[Flag, label("printed")]
    failed: Annotated[dict[str, Text], label("precondition not met"), keys("precondition")]
    snippet_requires: Annotated[list[str] | UnsetType, label("snippet requires")] = UNSET
    snippet_failed: Annotated[dict[str, Text] | UnsetType, label("snippet precondition not met"),
                              keys("precondition")] = UNSET


class RankStepRef(Evidence, frozen=True, forbid_unknown_fields=True):
    """The rank and step a figure is taken from (a rule's representative rank-step)."""

    rank: Annotated[Count, label("rank")]
    step: Annotated[Count, label("step")]


class AlphaBetaLink(Evidence, frozen=True, forbid_unknown_fields=True):
    """A link's α-β fit (analyzer.model.link.Link.evidence, handed on as that dict)."""

    alpha_us: Annotated[Us, label("α (latency)")]
    beta_gbps: Annotated[Gbps, label("β (bandwidth)")]
    n: Annotated[Count, label("ranks")]
    cross_node: Annotated[Flag, label("crosses nodes")]
    nodes: Annotated[Count, label("nodes")]
    s_star_bytes: Annotated[Bytes, label("S* = α·β (latency-bandwidth crossover)")]
    source: Annotated[Text, label("source")]


class FixMemory(Evidence, frozen=True, forbid_unknown_fields=True):
    """``evidence.memory``: whether a fix fits the GPU (analyzer.job.memory.fit / fix_memory). The
    rules hand on the dict those write (its keys in the order of the path it took); this declares it."""

    added_bytes: Annotated[Bytes | UnsetType, label("bytes the fix adds")] = UNSET
    added_source: Annotated[Text | UnsetType, label("how the added bytes are known")] = UNSET
    device_bytes: Annotated[Bytes | UnsetType, label("device memory")] = UNSET
    measured_peak_bytes: Annotated[Bytes | UnsetType, label("measured peak")] = UNSET
    fits: Annotated[Flag | UnsetType, label("fits")] = UNSET
    peak_bytes: Annotated[Bytes | UnsetType, label("peak after the fix")] = UNSET
    margin: Annotated[Share | UnsetType, label("margin kept free")] = UNSET
    how: Annotated[Text | UnsetType, label("how")] = UNSET
    why: Annotated[Text | UnsetType, label("why")] = UNSET
    text: Annotated[Text | UnsetType, label("in words")] = UNSET


class FindingEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    """The keys ``rules.engine.RuleContext.finding`` appends to every rule's evidence (after the
    rule's own): each fix's preconditions, the part of a rule's estimate the typical step cannot
    hold, the part of a model's projection outside the leaves the finding names, the prediction
    (rendered by reports/prediction.py; a rule that gives its own declares it in its type)."""

    fix_preconditions: Annotated[list[FixCheck], label("fixes and what they require")] = []
    estimate_beyond_typical_step_us: Annotated[Us | UnsetType, label("estimate beyond the typical step")] = UNSET
    gain_outside_recovered_leaves_us: Annotated[Us | UnsetType, label("gain outside the leaves it names")] = UNSET
    prediction: dict[str, Any] | UnsetType = UNSET


#: The keys the engine writes (FindingEvidence's fields): a rule's own type declares none of them
#: but ``prediction`` (a rule that gives its own prediction writes it where it writes it).
ENGINE_KEYS = tuple(FindingEvidence.__struct_fields__)

_TYPES: dict[str, type[Evidence]] = {}


def evidence_dict(evidence: Evidence) -> dict[str, Any]:
    """A rule's evidence as the plain dict a finding holds: each field in the type's order, a field
    left UNSET omitted, nested records as dicts. Like ``msgspec.to_builtins``, but every other value
    kept as the rule computed it (a numpy scalar, a tuple), so the finding is what it was before
    the type: its JSON (the Result's encoder turns those into numbers and lists) and its views alike."""
    return _plain(evidence)


def _plain(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        return {name: _plain(v) for name in value.__struct_fields__ if (v := getattr(value, name)) is not UNSET}
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    if type(value) is list:
        return [_plain(v) for v in value]
    return value


def register_evidence(rule: str, evidence: type[Evidence]) -> None:
    """Record rule ``rule``'s evidence type (rules.engine.register does, for a rule with ``Evidence``)."""
    _TYPES[rule] = evidence


def evidence_type(rule: Any) -> type[Evidence] | None:
    """The evidence type of the rule named ``rule`` (None: no type yet, or no such rule registered)."""
    return _TYPES.get(rule) if isinstance(rule, str) else None


@functools.lru_cache(maxsize=None)
def evidence_spec(evidence: type[Evidence]) -> dict[str, Field]:
    """Every field the type declares, and the engine's (FindingEvidence), each with its label,
    unit and what its keys are: what a view needs to render a finding's evidence. A field holding
    a record (a nested type, or a mapping or list of them) carries that record's own declarations
    (``Field.record``), which the views read inside it first: one name may mean one thing at the
    top and another in a record (a measured peak, and the peak after a fix in ``memory``). The
    nested records' fields are also here, after the type's own, for a view that meets one outside
    its record (a value handed on as a dict). Derived from the annotations once per type."""
    out = dict(_own(evidence))
    for name, declared in _own(FindingEvidence).items():
        out.setdefault(name, declared)
    _fallbacks(out, out, set())
    return out


@functools.lru_cache(maxsize=None)
def _own(struct: type) -> dict[str, Field]:
    """``struct``'s own fields' declarations, each record-holding one with its record's."""
    hints = typing.get_type_hints(struct, include_extras=True)
    out: dict[str, Field] = {}
    for name in struct.__struct_fields__:  # type: ignore[attr-defined]
        hint = hints[name]
        extra = _extras(hint)
        record: dict[str, Field] | None = None
        for nested in _structs_in(hint):
            record = dict(record or {})
            for key, declared in _own(nested).items():
                record.setdefault(key, declared)
        out[name] = Field(extra.get("label", name.replace("_", " ")), extra.get("unit") or _value_unit(hint),
                          extra.get("keys"), extra.get("inner"), tuple(extra.get("columns", ())), record)
    return out


def _fallbacks(spec: dict[str, Field], out: dict[str, Field], seen: set[int]) -> None:
    """The records' fields under ``spec``, added to ``out`` where it has no field of that name."""
    for declared in list(spec.values()):
        if declared.record is None or id(declared.record) in seen:
            continue
        seen.add(id(declared.record))
        for name, inner in declared.record.items():
            out.setdefault(name, inner)
        _fallbacks(dict(declared.record), out, seen)


def _parts(hint: Any) -> tuple[Any, list[Meta]]:
    """(the type under its Annotated and Union layers' metadata, that metadata)."""
    metas: list[Meta] = []
    while typing.get_origin(hint) is Annotated:
        metas += [m for m in hint.__metadata__ if isinstance(m, Meta)]
        hint = hint.__origin__
    return hint, metas


def _extras(hint: Any) -> dict[str, Any]:
    """The label, unit, keys... a field's annotation declares (through Unions: ``Us | UnsetType``)."""
    hint, metas = _parts(hint)
    extra: dict[str, Any] = {}
    if typing.get_origin(hint) in (Union, types.UnionType):
        for arg in typing.get_args(hint):
            extra.update(_extras(arg))
    for meta in metas:
        extra.update(meta.extra or {})
    return extra


def _value_unit(hint: Any) -> str | None:
    """The unit of a container's values (``dict[str, Us]``: µs), where the field declares none."""
    hint, _ = _parts(hint)
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return next((u for a in typing.get_args(hint) if (u := _value_unit(a))), None)
    if origin in (dict, list, tuple):  # a tuple: its last position's (``[step, {rank: µs}]`` pairs)
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        value = args[-1] if args else None
        return (_extras(value).get("unit") or _value_unit(value)) if value is not None else None
    return None


def _structs_in(hint: Any) -> list[type]:
    hint, _ = _parts(hint)
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return [hint]
    return [s for arg in typing.get_args(hint) for s in _structs_in(arg)]
