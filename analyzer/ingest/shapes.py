"""The CPU ops whose recorded shapes tell their FLOPs (issue 29), kept apart from the markers.

With ``record_shapes=True`` the profiler writes ``Input Dims``, ``Input type`` and (torch >=
2.1) ``Concrete Inputs`` on every CPU op. Only the ops whose FLOPs follow from them are kept
(``SHAPE_OP_NAMES``: matrix multiplies, attention, convolution), with their raw argument text:
the text is parsed later, once per distinct combination (``analyzer.rank.flops``), never per
event. Per-event work here is C-level passes over the rows of those names only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import count
from operator import attrgetter, itemgetter
from typing import Any, Callable

import numpy as np

# The names whose shapes are kept, by family; analyzer.rank.flops holds each one's formula.
# Composite ops (matmul, linear, scaled_dot_product_attention, convolution) are listed too: the
# FLOPs are counted on the leaf op only, so a composite counts when nothing under it does.
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
            "aten::linear", "aten::_addmm_activation", "aten::_scaled_mm", "aten::_grouped_mm")
ATTENTION_OPS = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_flash_attention_forward", "aten::_flash_attention_backward",
    "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
    # flash-attn >= 2.6 registers its kernels as torch custom ops (namespace flashattn, earlier flash_attn)
    "flashattn::_flash_attn_forward", "flashattn::_flash_attn_backward",
    "flashattn::_flash_attn_varlen_forward", "flashattn::_flash_attn_varlen_backward",
    "flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward",
    "flash_attn::_flash_attn_varlen_forward", "flash_attn::_flash_attn_varlen_backward",
)
CONV_OPS = ("aten::convolution", "aten::_convolution", "aten::convolution_backward")
OTHER_OPS = ("aten::mv", "aten::addmv", "aten::dot", "aten::vdot")
SHAPE_OP_NAMES = frozenset(GEMM_OPS + ATTENTION_OPS + CONV_OPS + OTHER_OPS)

_RECORDED = attrgetter("input_dims", "input_type", "concrete_inputs")
_DTYPES = (np.int64, np.int64, np.int32, np.int32, np.int32, np.int64)


@dataclass
class ShapeOps:
    """The kept CPU ops, sorted by start, then longest first, then External id (an op and the
    one it calls can share both times at µs resolution; the caller's id is the smaller): times
    in int64 ns on the trace's clock, ``thread`` an index into ``RankTrace.threads``, ``name``
    into ``names`` (their own table: the trace's strings stay as they were), ``args`` into
    ``recorded`` (the distinct ``(Input Dims, Input type, Concrete Inputs)`` JSON texts, empty
    bytes when absent), ``external_id`` -1 when absent."""

    ts: np.ndarray
    end: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    args: np.ndarray
    external_id: np.ndarray
    names: list[str] = field(default_factory=list)
    recorded: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts)


def empty_shape_ops() -> ShapeOps:
    return ShapeOps(*(np.empty(0, dtype=d) for d in _DTYPES))


class ShapeOpsBuilder:
    """The rows of the kept names, batch by batch (``ColumnBuilder`` hands it the CPU ops it
    has already factorized by name), exported and merged like the other columns."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._names: dict[str, int] = {}
        self._recorded: dict[tuple[bytes, bytes, bytes], int] = {}

    def add(self, events: list[Any], codes: np.ndarray, uniques: list[Any],
            times: Callable[[list[Any]], tuple[np.ndarray, np.ndarray, np.ndarray]],
            thread_ids: Callable[[list[Any]], np.ndarray],
            external_ids: Callable[[list[Any]], np.ndarray]) -> None:
        """``codes``/``uniques``: the events' names factorized; ``times``, ``thread_ids`` and
        ``external_ids``: the column builder's own conversions (start/end/valid, interned
        threads, the External id column)."""
        table = np.array([self._name_id(u) if isinstance(u, str) and u in SHAPE_OP_NAMES else -1 for u in uniques],
                         dtype=np.int32)
        if not (table >= 0).any():
            return
        rows = np.flatnonzero(table[codes] >= 0)
        if not len(rows):
            return
        chosen = _take(events, rows)
        start, end, valid = times(chosen)
        keep = np.flatnonzero(valid)
        if not len(keep):
            return
        if len(keep) < len(chosen):
            chosen = _take(chosen, keep)
        # each distinct recorded text is numbered once (a C-level counter, as the column names are)
        numbered: defaultdict = defaultdict(count().__next__)
        codes_of = np.fromiter(map(numbered.__getitem__, _recorded_texts(chosen)), dtype=np.int64, count=len(chosen))
        args = np.array([self._recorded_id(key) for key in numbered], dtype=np.int32)[codes_of]
        self._parts.append((start[keep], end[keep], thread_ids(chosen), table[codes[rows[keep]]], args,
                            external_ids(chosen)))

    def _name_id(self, name: str) -> int:
        found = self._names.get(name)
        if found is None:
            found = self._names[name] = len(self._names)
        return found

    def _recorded_id(self, key: tuple[bytes, bytes, bytes]) -> int:
        found = self._recorded.get(key)
        if found is None:
            found = self._recorded[key] = len(self._recorded)
        return found

    def export(self) -> dict[str, Any]:
        return {"parts": self._parts, "names": list(self._names), "recorded": list(self._recorded)}

    def merge(self, part: dict[str, Any], threads: np.ndarray) -> None:
        """Another builder's rows; ``threads``: its thread ids re-interned here."""
        names = np.array([self._name_id(n) for n in part["names"]] or [0], dtype=np.int32)
        recorded = np.array([self._recorded_id(key) for key in part["recorded"]] or [0], dtype=np.int32)
        self._parts += [(start, end, threads[thread], names[name], recorded[args], external)
                        for start, end, thread, name, args, external in part["parts"]]

    def finish(self) -> ShapeOps:
        names, recorded = list(self._names), list(self._recorded)
        if not self._parts:
            return ShapeOps(*(np.empty(0, dtype=d) for d in _DTYPES), names, recorded)
        columns = [np.concatenate([p[i] for p in self._parts]).astype(d, copy=False) for i, d in enumerate(_DTYPES)]
        self._parts = []
        start, end, thread, name, args, external = columns
        order = np.lexsort((args, name, thread, external, -end, start))
        # Exact duplicates (a trace merged twice) count once, as the markers' rows do.
        same = np.zeros(len(order), dtype=bool)
        if len(order) > 1:
            same[1:] = True
            for values in columns:
                ranked = values[order]
                same[1:] &= ranked[1:] == ranked[:-1]
        order = order[~same]
        return ShapeOps(*(c[order] for c in columns), names, recorded)


def _take(items: list[Any], index: np.ndarray) -> list[Any]:
    """``[items[i] for i in index]`` in one C-level call."""
    if len(index) == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def _recorded_texts(events: list[Any]) -> Any:
    """``map(_recorded_of, events)`` in C-level passes (a call per op cost a collective-heavy
    rank 30 ms): each of the three texts of every op's args, ``b""`` where the op has no args."""
    args = list(map(_ARGS, events))
    if None in args:
        return map(_recorded_of, events)
    return zip(*(map(bytes, map(getter, args)) for getter in _RECORDED_EACH))


_ARGS = attrgetter("args")
_RECORDED_EACH = (attrgetter("input_dims"), attrgetter("input_type"), attrgetter("concrete_inputs"))


def _recorded_of(event: Any) -> tuple[bytes, bytes, bytes]:
    args = event.args
    if args is None:
        return (b"", b"", b"")
    dims, types, concrete = _RECORDED(args)
    return (bytes(dims), bytes(types), bytes(concrete))
