"""Collectives: one row per communication kernel, with its size, group and exposed time;
DDP gradient buckets and FSDP units grouped from them.

Metadata sources, in order: the kernel's own args (newer Kineto), the enclosing
``record_param_comms`` op, the ``nccl:*`` op's ``Input Dims``, the kernel name. Unknown sizes
stay ``None``: a guessed byte count would silently poison every model built on it.
"""

from __future__ import annotations

import re
from collections import deque
from functools import lru_cache
from itertools import repeat
from operator import itemgetter, setitem
from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.base import intervals as iv
from analyzer.base.limits import MAX_DEVICE_BYTES
from analyzer.base.units import fmt_bytes
from analyzer.ingest.catalog import USER_LIBRARY, CommKernel, lookup
from analyzer.ingest.classify import fsdp_module_of, launching_comm_op
from analyzer.ingest.columns import _take, factorize
from analyzer.rank import p2p
from analyzer.rank.timeline import NO_STEP, PHASES, Attribution, compute_union, innermost_marker, locate
from analyzer.ingest.trace import GpuKind, Marker, RankTrace

# Canonical collective names (nccl-tests vocabulary).
_COLLECTIVE_WORDS = (
    ("allreduce", "allreduce"),
    ("allgather", "allgather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "alltoall"),
    ("broadcast", "broadcast"),
    ("sendrecv", "sendrecv"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
    ("gather", "gather"),
    ("scatter", "scatter"),
)

DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i32": 4, "u32": 4,
               "i64": 8, "u64": 8, "f8e4m3": 1, "f8e5m2": 1, "bool": 1}

_DTYPE_ALIASES = {
    "bfloat16": "bf16", "bf16": "bf16", "c10::bfloat16": "bf16",
    "half": "f16", "float16": "f16", "f16": "f16", "c10::half": "f16",
    "float": "f32", "float32": "f32", "f32": "f32",
    "double": "f64", "float64": "f64", "f64": "f64",
    "char": "i8", "int8": "i8", "int8_t": "i8", "i8": "i8", "signed char": "i8",
    "byte": "u8", "uint8": "u8", "uint8_t": "u8", "u8": "u8", "unsigned char": "u8",
    "int": "i32", "int32": "i32", "i32": "i32", "int32_t": "i32",
    "uint32": "u32", "u32": "u32", "uint32_t": "u32",
    "long": "i64", "long int": "i64", "int64": "i64", "i64": "i64", "int64_t": "i64",
    "uint64": "u64", "u64": "u64", "uint64_t": "u64",
    "float8_e4m3fn": "f8e4m3", "f8e4m3": "f8e4m3", "float8_e5m2": "f8e5m2", "f8e5m2": "f8e5m2",
    "bool": "bool",
}

_NAME_DTYPE = re.compile(r"_(bf16|f16|f32|f64|half|float|double|int8_t|uint8_t|int32_t|uint32_t|"
                         r"int64_t|uint64_t|i8|u8|i32|u32|i64|u64|f8e4m3|f8e5m2)(?=[_(]|$)")


def canonical_collective(text: str | None) -> str | None:
    if not text:
        return None
    return _canonical_collective(text)


@lru_cache(maxsize=4096)
def _canonical_collective(text: str) -> str | None:  # the same few names, once per row
    squashed = re.sub(r"[^a-z]", "", text.lower())
    for word, name in _COLLECTIVE_WORDS:
        if word in squashed:
            return name
    return None


def canonical_dtype(text: str | None) -> str | None:
    if not text:
        return None
    return _canonical_dtype(text) if type(text) is str else _DTYPE_ALIASES.get(text.strip().lower())


@lru_cache(maxsize=1024)
def _canonical_dtype(text: str) -> str | None:  # the same few names, once per row
    return _DTYPE_ALIASES.get(text.strip().lower())


def collective_from_kernel_name(name: str) -> str | None:
    # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_ReduceScatter_Sum_f32_RING_LL, ...
    match = re.search(r"(?:Kernel|Func)_([A-Za-z]+)", name)
    return canonical_collective(match.group(1)) if match else canonical_collective(name)


def dtype_from_kernel_name(name: str) -> str | None:
    match = _NAME_DTYPE.search(name)
    if match:
        return canonical_dtype(match.group(1))
    # A template's first argument: symm_mem's multimem_all_reduce_kernel<c10::BFloat16, ...>,
    # vLLM's cross_device_reduce_1stage<__nv_bfloat16, 8>.
    match = _TEMPLATE_DTYPE.search(name)
    return canonical_dtype(_CUDA_TYPES.get(match.group(1), match.group(1))) if match else None


_TEMPLATE_DTYPE = re.compile(r"<\s*(c10::BFloat16|c10::Half|__nv_bfloat16|__half|half|float|double)\s*[,>]")
_CUDA_TYPES = {"__nv_bfloat16": "bf16", "__half": "f16"}


def message_bytes(collective: str | None, in_nelems: int | None, out_nelems: int | None,
                  elem_bytes: int | None, group_size: int | None = None) -> int | None:
    """Size S the models use: all-gather's output, reduce-scatter's input, otherwise the input.
    A missing side is derived from the other only through the group size, never guessed."""
    if elem_bytes is None:
        return None
    if collective == "allgather":
        nelems = out_nelems if out_nelems is not None else _times(in_nelems, group_size)
    elif collective == "reduce_scatter":
        nelems = in_nelems if in_nelems is not None else _times(out_nelems, group_size)
    else:
        nelems = in_nelems if in_nelems is not None else out_nelems
    return None if nelems is None else int(nelems) * elem_bytes


def _times(nelems: int | None, factor: int | None) -> int | None:
    return None if nelems is None or not factor else nelems * factor


def _tensor_elems(dims: Any) -> int | None:
    """Elements of one recorded argument: a tensor's dims, or a TensorList's (summed). A
    negative dimension gives a negative count: no tensor has it, and the message is said to be
    implausible (``drop_implausible_sizes``)."""
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        if any(d < 0 for d in dims):
            return -1
        count = 1
        for d in dims:
            count *= d
        return count
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        parts = [_tensor_elems(d) for d in dims]
        if any(p is None for p in parts):
            return None
        return -1 if any(p < 0 for p in parts) else sum(parts)  # type: ignore[operator]
    return None


# Which recorded arguments hold (output, input) in the c10d dispatcher ops' schemas;
# the others (allreduce_, broadcast_, nccl:* ops...) record the message as argument 0.
_OUT_IN_ARGS = {
    "_allgather_base_": (0, 1), "allgather_into_tensor_coalesced_": (0, 1),
    "_reduce_scatter_base_": (0, 1), "reduce_scatter_tensor_coalesced_": (0, 1),
    "alltoall_base_": (0, 1), "allgather_": (0, 1), "reduce_scatter_": (0, 1),
    "alltoall_": (0, 1),
}


def sizes_from_input_dims(op_name: str, dims: Any, types: Any) -> tuple[int | None, int | None, str | None]:
    """(in_nelems, out_nelems, dtype) of a ``c10d::*`` or ``nccl:*`` op from its recorded shapes."""
    if not isinstance(dims, list) or not dims:
        return None, None, None
    short = op_name.split("::", 1)[-1] if "::" in op_name else op_name.split(":", 1)[-1]
    dtype = None
    if isinstance(types, list):
        dtype = next((canonical_dtype(t) for t in types if isinstance(t, str) and canonical_dtype(t)), None)
    if short in _OUT_IN_ARGS and len(dims) > 1:
        out_arg, in_arg = _OUT_IN_ARGS[short]
        return _tensor_elems(dims[in_arg]), _tensor_elems(dims[out_arg]), dtype
    return _tensor_elems(dims[0]), None, dtype


def collectives_for_rank(rank: RankTrace, att: Attribution, origin_ns: int,
                         warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per communication kernel of this rank (CPU-side ops when it has no GPU comm);
    messages larger than the device's memory are left unknown (``drop_implausible_sizes``),
    with a warning in ``warnings``.

    A collective's metadata repeats (the same group, collective, dtype and sizes; only its
    ``seq``, ``Comms Id`` and times differ), so everything its sources decide is worked out once
    per distinct combination of them (:func:`_combinations`), and the rows are built in C-level
    passes from that and the per-row columns (issue 13). Rows whose kind is inferred, or that
    carry a ``collective_source``, are built one by one (:func:`_row`)."""
    gpu = rank.gpu
    rows_idx = np.flatnonzero(gpu.kind == GpuKind.COMM)
    if len(rows_idx) == 0:
        return drop_implausible_sizes(_cpu_side_collectives(rank, origin_ns), rank.devices, warnings)
    m = rank.markers
    ts, thread = att.launch_ts[rows_idx], att.launch_thread[rows_idx]
    params_row = innermost_marker(m, Marker.COMM_PARAMS, ts, thread)
    op_row = innermost_marker(m, Marker.COMM_OP, ts, thread)
    module_row = _module_markers(rank, ts, thread)
    compute = compute_union(gpu)
    covered = iv.covered_length(compute, gpu.ts[rows_idx], gpu.end[rows_idx])
    sources = _Sources(rank, rows_idx, params_row, op_row)
    combos = _combinations(rank, sources)
    # Times as columns, each element then rounded by Python's round (correctly rounded, as the
    # row-by-row code did: numpy's rounding can differ in the last digit).
    dur = gpu.end[rows_idx] - gpu.ts[rows_idx]
    start_us = _us3(gpu.ts[rows_idx] - origin_ns)
    dur_us, exposed_us = _us3(dur), _us3(dur - covered.astype(np.int64))
    launch_us = [us if linked else None for us, linked in zip(_us3(ts - origin_ns), (thread >= 0).tolist())]
    steps = [step if step != NO_STEP else None for step in att.step[rows_idx].tolist()]
    phases = _take(PHASES, att.phase[rows_idx])
    streams = gpu.stream[rows_idx].tolist()
    modules = _module_names(rank, module_row)
    codes = sources.codes
    seqs, comms_ids = sources.per_row("seq", combos.seq_from), sources.per_row("comms_id", combos.comms_id_from)
    # Each row: its combination's row (a C-level clone), then its own fields set column by column
    # (keys already in place: the order stays).
    out = list(map(dict.copy, _take(combos.rows, codes)))
    for key, column in (("seq", seqs), ("comms_id", comms_ids), ("step", steps), ("phase", phases),
                        ("stream", streams), ("start_us", start_us), ("dur_us", dur_us), ("exposed_us", exposed_us),
                        ("launch_us", launch_us), ("module", modules)):
        deque(map(setitem, out, repeat(key), column), 0)
    inferred = _kinds_from_stream_order(rank, gpu, rows_idx, combos.metas, combos.kernels, codes, params_row, op_row)
    for k in sorted(set(np.flatnonzero(combos.sourced[codes]).tolist()) | set(inferred)):
        meta = sources.meta(k)
        if k in inferred:
            meta["collective"], meta["collective_source"] = inferred[k], "stream order of CPU collectives"
        c = codes[k]
        out[k] = _row(rank.rank, meta, combos.rows[c]["group"], step=steps[k], phase=phases[k], stream=streams[k],
                      start_us=start_us[k], dur_us=dur_us[k], exposed_us=exposed_us[k], launch_us=launch_us[k],
                      kernel=combos.rows[c]["kernel"], library=combos.rows[c]["library"], module=modules[k],
                      on_gpu=True)
        if "peers" in combos.rows[c]:
            out[k]["peers"] = combos.rows[c]["peers"]
    if combos.p2p:  # coalesced batches' kernels: their members are the free send / recv ops
        groups = _GroupLookup(rank)
        p2p.add_batches(rank, out, ts, thread, params_row,
                        lambda row: _p2p_member(rank, groups, m.comm_args.get(row, {})))
    share_groups(out)  # one dict per process group, not one per row (and pickled as shared)
    return drop_implausible_sizes(out, rank.devices, warnings)


def device_memory_limit(devices: list[dict[str, Any]]) -> int:
    """The most bytes one message can have: its buffer lives in one device's memory (the
    largest ``deviceProperties`` entry), else ``MAX_DEVICE_BYTES``."""
    known = [d["total_mem_bytes"] for d in devices if d.get("total_mem_bytes")]
    return max(known) if known else MAX_DEVICE_BYTES


def drop_implausible_sizes(rows: list[dict[str, Any]], devices: list[dict[str, Any]],
                           warnings: list[str] | None) -> list[dict[str, Any]]:
    """``rows`` with every message whose input or output is larger than the device's memory
    (or negative: a negative Input Dims) made unknown: bytes and element counts None, left out
    of the models as an unknown size is; one warning names the field that gave the first. Two
    C-level passes when there is none (every real trace)."""
    limit = device_memory_limit(devices)
    counts = [*map(itemgetter("in_nelems"), rows), *map(itemgetter("out_nelems"), rows)]
    known = list(filter(None, counts))  # None and 0 are plausible
    try:
        if not known or (min(known) >= 0 and max(known) * _WIDEST <= limit):
            return rows
    except TypeError:  # a count of another type (a hand-made row): judged row by row below
        pass
    bad = [i for i, row in enumerate(rows) if not _plausible(row, limit)]
    if not bad:
        return rows
    first = rows[bad[0]]
    if warnings is not None:
        memory = fmt_bytes(limit) + ("" if any(d.get("total_mem_bytes") for d in devices) else ": no device has more")
        warnings.append(f"{len(bad)} collective(s) with a negative message or one larger than the device's memory "
                        f"({memory}), e.g. {_size_field(first, limit)} ({first['collective']}): implausible, "
                        "size left unknown")
    for i in bad:
        row = rows[i]
        row["bytes"] = row["in_nelems"] = row["out_nelems"] = row["size_source"] = None
    return rows


_WIDEST = max(DTYPE_BYTES.values())  # bytes of the widest element


def _plausible(row: dict[str, Any], limit: int) -> bool:
    """Both sides of the message fit the device (an element of unknown type is at least a byte)."""
    width = DTYPE_BYTES.get(row["dtype"] or "", 1)
    return all(n is None or type(n) not in (int, float) or 0 <= n * width <= limit
               for n in (row["in_nelems"], row["out_nelems"]))


def _size_field(row: dict[str, Any], limit: int | None = None) -> str:
    """The field the first implausible side of a row's message was read from, as the trace
    names it, with its value."""
    if row["size_source"] == "Input Dims":
        return "args.Input Dims"
    width = DTYPE_BYTES.get(row["dtype"] or "", 1)
    side = "in_nelems" if row["in_nelems"] is not None and not 0 <= row["in_nelems"] * width <= (limit or 0) \
        else "out_nelems"
    return f"args.{'In' if side == 'in_nelems' else 'Out'} msg nelems {row[side]:,}"


class _Sources:
    """The metadata sources of each communication kernel: its own args, the enclosing
    ``record_param_comms`` op's, the ``nccl:*``/``c10d::*`` op's and that op's name, each as its
    position in the rank's ``CommArgs`` columns (-1: none); and ``codes``, the number of each
    kernel's distinct combination of them (first seen first), where two args count the same when
    they share their repeating fields and differ at most in ``seq`` and ``Comms Id`` values."""

    def __init__(self, rank: RankTrace, rows_idx: np.ndarray, params_row: np.ndarray, op_row: np.ndarray) -> None:
        m = rank.markers
        self.rank = rank
        self.name = gpu_names = rank.gpu.name[rows_idx].tolist()
        self.kernel = rank.kernel_comm_args.positions(rows_idx)
        self.params = m.comm_args.positions(params_row)
        self.op = m.comm_args.positions(op_row)
        self.op_name = np.where(op_row >= 0, m.name[np.maximum(op_row, 0)], -1).tolist() if len(m.name) else \
            [-1] * len(op_row)
        self.codes, _ = factorize(zip(gpu_names, rank.kernel_comm_args.combination_keys(self.kernel),
                                      m.comm_args.combination_keys(self.params), m.comm_args.combination_keys(self.op),
                                      self.op_name))

    def args(self, k: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
        """Kernel ``k``'s three args (None: no such source)."""
        kernel_args, marker_args = self.rank.kernel_comm_args, self.rank.markers.comm_args
        return kernel_args.at(int(self.kernel[k])), marker_args.at(int(self.params[k])), marker_args.at(int(self.op[k]))

    def meta(self, k: int) -> dict[str, Any]:
        """Kernel ``k``'s merged metadata (:func:`_merge_sources`), its own."""
        strings = self.rank.strings
        name = strings[self.name[k]]
        return _merge_sources(*self.args(k), strings[self.op_name[k]] if self.op_name[k] >= 0 else None, name,
                              lookup(name))

    def per_row(self, key: str, source: np.ndarray) -> list[Any]:
        """Each kernel's ``key`` (``seq`` or ``comms_id``) in its merged metadata, from the
        source its combination names (0: none, 1: the kernel's args, 2: record_param_comms')."""
        where = source[self.codes]
        params = self.rank.markers.comm_args.values(key, self.params)
        if (where == 2).all():  # the usual: record_param_comms' args
            return params.tolist()
        kernel = self.rank.kernel_comm_args.values(key, self.kernel)
        return np.where(where == 1, kernel, np.where(where == 2, params, None)).tolist()


class _Combination:
    """Everything a row takes from its combination of sources, by combination number."""

    def __init__(self) -> None:
        self.metas: list[dict[str, Any]] = []  # the merged metadata of its first kernel
        self.kernels: list[CommKernel | None] = []
        self.rows: list[dict[str, Any]] = []  # its row (:func:`_row`), the per-kernel fields None
        self.seq_from = self.comms_id_from = self.sourced = np.empty(0)
        self.p2p = False  # any send / recv / batch among them


def _combinations(rank: RankTrace, sources: _Sources) -> _Combination:
    """The row fields of each distinct combination of sources, from its first kernel."""
    amd = _on_amd(rank)
    groups = _GroupLookup(rank)
    combos = _Combination()
    seq_from, comms_id_from, sourced = [], [], []
    for k in np.unique(sources.codes, return_index=True)[1].tolist():
        meta = sources.meta(k)
        name = rank.strings[sources.name[k]]
        kernel = lookup(name)
        op_name = rank.strings[sources.op_name[k]] if sources.op_name[k] >= 0 else None
        group = groups.of(meta, _in_c10d_group(kernel, op_name))
        library = _launching_library(op_name) or _library(kernel, amd)
        combos.rows.append(_row(rank.rank, meta, group, step=None, phase="", stream=None, start_us=0.0, dur_us=0.0,
                                exposed_us=None, launch_us=None, kernel=name, library=library,
                                module=None, on_gpu=True))
        if meta["collective"] in p2p.P2P_KINDS:
            combos.p2p = True
            _set_peers(combos.rows[-1], rank.rank, meta, op_name, sources.args(k)[2])
        combos.metas.append(meta)
        combos.kernels.append(kernel)
        kernel_args, params_args, _ = sources.args(k)
        # The merge: the kernel's args win, record_param_comms fills the rest.
        seq_from.append(1 if kernel_args and "seq" in kernel_args else 2 if params_args else 0)
        comms_id_from.append(1 if kernel_args and "comms_id" in kernel_args else 2 if params_args else 0)
        sourced.append(bool(meta.get("collective_source")))
    combos.seq_from, combos.comms_id_from = np.array(seq_from, dtype=np.int8), np.array(comms_id_from, dtype=np.int8)
    combos.sourced = np.array(sourced, dtype=bool)
    return combos


def _launching_library(op_name: str | None) -> str | None:
    """The library of a kernel a launching comm op (``launching_comm_op``) started: symm_mem's
    ops', else a custom all-reduce's (vLLM, SGLang, TensorRT-LLM); None for c10d's ops."""
    if not op_name or not launching_comm_op(op_name):
        return None
    return "symm_mem" if op_name.startswith("symm_mem::") else "custom_allreduce"


def kernels_of_launching_ops(rank: RankTrace, att: Attribution) -> None:
    """Kernels a launching comm op started that the catalog does not name (a new symmetric-memory
    or custom all-reduce kernel) are communication: their kind set in ``rank.gpu.kind``, once
    (nothing is done when the trace holds no such op)."""
    m = rank.markers
    ops = arrays.unique(m.name[m.kind == Marker.COMM_OP]).tolist()
    launching = [n for n in ops if launching_comm_op(rank.strings[n])]
    if not launching:
        return
    compute = np.flatnonzero(rank.gpu.kind == GpuKind.COMPUTE)
    row = innermost_marker(m, Marker.COMM_OP, att.launch_ts[compute], att.launch_thread[compute])
    hit = (row >= 0) & np.isin(m.name[np.maximum(row, 0)], launching)
    rank.gpu.kind[compute[hit]] = GpuKind.COMM


def _in_c10d_group(kernel: CommKernel | None, op_name: str | None) -> bool:
    """Whether a kernel runs in one of the trace's c10d process groups: NCCL's (and its forks'),
    and those a symmetric-memory op launched (it names a c10d group); others (DeepEP's, a custom
    all-reduce's) use communicators of their own."""
    return kernel is not None and (kernel.library in NCCL_NAMED or bool(op_name and op_name.startswith("symm_mem::")))


def _set_peers(row: dict[str, Any], rank: int, meta: dict[str, Any], op_name: str | None,
               op_args: dict[str, Any] | None) -> None:
    """A send's or receive's ``peers`` (analyzer.rank.p2p), on its row where the trace names
    a usable peer: only point-to-point rows ever carry the key."""
    found = p2p.members(row["collective"], meta, op_name, op_args, row["group"], rank)[0]
    if found is not None:
        row["peers"] = found


def _p2p_member(rank: RankTrace, groups: "_GroupLookup", args: dict[str, Any]) -> tuple[list | None, dict[str, Any]]:
    """(members, metadata) of a ``record_param_comms`` that launched no kernel: one op of a
    coalesced batch."""
    kind = canonical_collective(args.get("collective"))
    if kind not in ("send", "recv"):
        return None, args
    return p2p.members(kind, args, None, None, groups.of(args, True), rank.rank)[0], args


def _module_names(rank: RankTrace, module_row: np.ndarray) -> list[str | None]:
    """The FSDP module of each annotation row (-1: None), parsed once per distinct name."""
    names = np.where(module_row >= 0, rank.markers.name[np.maximum(module_row, 0)], -1) if len(rank.markers.name) \
        else np.full(len(module_row), -1)
    present = arrays.unique(names)
    table = dict(zip(present.tolist(), [fsdp_module_of(rank.strings[n]) if n >= 0 else None for n in present.tolist()]))
    return list(map(table.__getitem__, names.tolist()))


def _us3(ns: np.ndarray) -> list[float]:
    """Nanoseconds as µs rounded to 3 decimals, exactly as ``round(int(v) / 1000.0, 3)`` per
    value (int64 to float64 and the division are the same IEEE operations in numpy).

    ``v / 1000.0`` is the double nearest the 3-decimal number v/1000, off it by at most half an
    ulp; below 2**42 µs (51 days) that is under half a thousandth, so rounding to 3 decimals lands on
    v/1000 again and gives back the same double: only values beyond 2**40 µs (12.7 days from the
    trace's origin: hostile or absolute clocks) need Python's round."""
    us = ns.astype(np.int64) / 1000.0
    out = us.tolist()
    for i in np.flatnonzero(~(np.abs(us) < _US3_EXACT)).tolist():
        out[i] = round(out[i], 3)
    return out


_US3_EXACT = 2.0**40  # µs; exact up to 2**42 (see _us3), with a margin


def _groups_by_name(rank: RankTrace) -> dict[Any, list[dict[str, Any]]]:
    """The trace's declared process groups by name, in declaration order."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for pg in rank.process_groups:
        groups.setdefault(pg["name"], []).append(pg)
    return groups


def _cpu_collective_rows(rank: RankTrace) -> np.ndarray:
    """One CPU marker per issued collective: record_param_comms when the trace has it, else the
    ``nccl:*`` ops, else the ``c10d::*`` ones (the two nest: counting both would double)."""
    m = rank.markers
    params = np.flatnonzero(m.kind == Marker.COMM_PARAMS)
    if len(params):
        return params
    ops = np.flatnonzero(m.kind == Marker.COMM_OP)
    for prefix in ("nccl:", "c10d::"):
        rows = np.array([r for r in ops if rank.strings[m.name[r]].startswith(prefix)], dtype=np.int64)
        if len(rows):
            return rows
    return ops


def _library(kernel: CommKernel | None, amd: bool) -> str:
    if kernel is None:
        return USER_LIBRARY
    # RCCL keeps NCCL's kernel names: only the device tells them apart.
    return "rccl" if amd and kernel.library == "nccl" else kernel.library


def _on_amd(rank: RankTrace) -> bool:
    return any(re.search(r"\bAMD\b|Instinct|\bMI\d{3}", d.get("name") or "") for d in rank.devices)


def _kinds_from_stream_order(rank: RankTrace, gpu, rows_idx: np.ndarray, metas: list[dict[str, Any]],
                             kernels: list[CommKernel | None], codes: np.ndarray, params_row: np.ndarray,
                             op_row: np.ndarray) -> dict[int, str]:
    """Generic NCCL kernels with no CPU link (their name says nothing of the collective): each
    takes the kind of the next CPU collective no kernel is linked to, in its stream's order.
    A stream runs one communicator's work in issue order, so the CPU collectives of the
    stream's process group (when its linked kernels tell it) are the candidates. ``metas`` (the
    merged metadata, read only) and ``kernels`` (the catalog entries) are by combination, ``codes``
    each kernel's; gives the kind of each kernel so inferred, by its index."""
    generic = [meta["collective"] == "unknown" and kernel is not None and kernel.generic
               for meta, kernel in zip(metas, kernels)]
    todo = np.flatnonzero(np.array(generic, dtype=bool)[codes] & (params_row < 0) & (op_row < 0)).tolist()
    inferred: dict[int, str] = {}
    if not todo:
        return inferred
    m = rank.markers
    linked = set(params_row[params_row >= 0].tolist()) | set(op_row[op_row >= 0].tolist())
    free = []  # (start ns, collective, process group) of CPU collectives with no kernel
    for row in _cpu_collective_rows(rank):
        if int(row) in linked:
            continue
        args = m.comm_args.get(int(row), {})
        kind = canonical_collective(args.get("collective")) or canonical_collective(
            rank.strings[m.name[row]].split(":", 1)[-1])
        if kind not in (None, "barrier"):
            free.append([int(m.ts[row]), kind, args.get("pg_name")])
    stream_pg: dict[int, Any] = {}
    for k, code in enumerate(codes.tolist()):
        if metas[code].get("pg_name") is not None:
            stream_pg.setdefault(int(gpu.stream[rows_idx[k]]), metas[code]["pg_name"])
    claimed = set(stream_pg.values())
    for k in sorted(todo, key=lambda k: int(gpu.ts[rows_idx[k]])):
        row = rows_idx[k]
        pg = stream_pg.get(int(gpu.stream[row]))
        match = next((c for c in free if c[0] <= int(gpu.ts[row])
                      and (c[2] == pg if pg is not None else c[2] not in claimed)), None)
        if match is not None:
            free.remove(match)
            inferred[k] = match[1]
    return inferred


def _module_markers(rank: RankTrace, ts: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Innermost FSDP2 ``FSDP::... (fqn)`` annotation around each launch, or -1."""
    m = rank.markers
    best = np.full(len(ts), -1, dtype=np.int64)
    for kind in (Marker.FSDP_UNIT, Marker.FORWARD, Marker.BACKWARD):
        rows = innermost_marker(m, kind, ts, thread)
        todo = np.flatnonzero((rows >= 0) & (best < 0))
        names = m.name[rows[todo]]
        present = arrays.unique(names)
        fsdp = np.zeros(int(present.max()) + 1 if len(present) else 0, dtype=bool)  # by name, parsed once
        fsdp[present] = [fsdp_module_of(rank.strings[n]) is not None for n in present.tolist()]
        hit = todo[fsdp[names]] if len(todo) else todo
        best[hit] = rows[hit]
    return best


# Libraries whose kernel names follow NCCL's <Kernel|Func>_<Collective>_... convention.
NCCL_NAMED = ("nccl", "rccl", "msccl")
_CUSTOM_AR_RANKS = re.compile(r"cross_device_reduce_[12]stage<[^,<>]+,\s*(\d{1,4})\s*>")
# Libraries whose kernel names name the collective (symm_mem's multimem_all_reduce_kernel,
# multimem_all_gather_kernel...).
NAMED_KERNELS = (*NCCL_NAMED, "symm_mem")


def _merge_sources(kernel_args, params_args, op_args, op_name, kernel_name,
                   kernel: CommKernel | None = None) -> dict[str, Any]:
    """Collective metadata from the best available source, remembering which one gave the size.
    The collective: the CPU op's, else the catalog's for that kernel, else the kernel name's
    (NCCL's naming only, and never a generic kernel's name: it says nothing of what ran)."""
    # The kernel's own args win; record_param_comms fills the rest (keys are only looked up).
    meta: dict[str, Any] = {**params_args, **kernel_args} if params_args and kernel_args \
        else dict(params_args or kernel_args or ())
    if kernel_args and ("in_nelems" in kernel_args or "out_nelems" in kernel_args):
        size_source: str | None = "kernel args"
    elif params_args and ("in_nelems" in params_args or "out_nelems" in params_args):
        size_source = "record_param_comms"
    else:
        size_source = None
    collective = canonical_collective(meta.get("collective"))
    if collective is None and op_name:
        collective = canonical_collective(op_name.split(":", 1)[-1])
    if collective is None and kernel is not None:
        collective = kernel.collective
    if collective is None and kernel is not None and kernel.library in NAMED_KERNELS and not kernel.generic:
        collective = collective_from_kernel_name(kernel_name)
    if meta.get("group_size") is None and kernel is not None and kernel.library == "custom_allreduce":
        ranks = _CUSTOM_AR_RANKS.search(kernel_name)  # vLLM's <T, ngpus>: the group's size
        if ranks:
            meta["group_size"] = int(ranks.group(1))
    dtype = canonical_dtype(meta.get("dtype"))
    if size_source is None and op_args and op_name and "input_dims" in op_args:
        in_n, out_n, op_dtype = sizes_from_input_dims(op_name, op_args["input_dims"], op_args.get("input_types"))
        if in_n is not None or out_n is not None:
            meta["in_nelems"], meta["out_nelems"] = in_n, out_n
            size_source = "Input Dims"
        dtype = dtype or op_dtype
    if dtype is None:
        dtype = dtype_from_kernel_name(kernel_name)
    meta["collective"] = collective or "unknown"
    meta["dtype"] = dtype
    meta["size_source"] = size_source
    return meta


def _row(rank: int, meta: dict[str, Any], group: dict[str, Any], *, step: int | None, phase: str, stream: Any,
         start_us: float, dur_us: float, exposed_us: float | None, launch_us: float | None, kernel: str | None,
         library: str | None, module: str | None, on_gpu: bool) -> dict[str, Any]:
    """One collective row, built as one dict (the rank's rows become a table: RankAnalysis)."""
    collective, dtype = meta["collective"], meta["dtype"]
    in_n, out_n = meta.get("in_nelems"), meta.get("out_nelems")
    row = {
        "rank": rank, "collective": collective, "dtype": dtype, "in_nelems": in_n, "out_nelems": out_n,
        "bytes": message_bytes(collective, in_n, out_n, DTYPE_BYTES.get(dtype) if dtype else None, group["size"]),
        "size_source": meta["size_source"], "group": group, "seq": meta.get("seq"), "comms_id": meta.get("comms_id"),
        "collective_source": meta.get("collective_source"),  # an inferred kind says so; else no key
        "step": step, "phase": phase, "stream": stream, "start_us": start_us, "dur_us": dur_us,
        "exposed_us": exposed_us, "launch_us": launch_us, "kernel": kernel, "library": library, "module": module,
        "on_gpu": on_gpu,
    }
    if not row["collective_source"]:
        del row["collective_source"]
    return row


class _GroupLookup:
    """The process group of each of a rank's collectives: one dict per distinct (name, ranks,
    description, size, sole group) of their metadata, so that a group's rows share one dict
    from the start (a collective-heavy rank has thousands of rows and a few groups)."""

    def __init__(self, rank: RankTrace) -> None:
        self.rank, self.by_name = rank, _groups_by_name(rank)
        self.made: dict[tuple, dict[str, Any]] = {}

    def of(self, meta: dict[str, Any], sole_group: bool) -> dict[str, Any]:
        ranks = meta.get("pg_ranks")  # a list of ints (ingest.columns.parse_ranks) or absent
        key = (meta.get("pg_name"), None if ranks is None else tuple(ranks), meta.get("pg_desc"),
               meta.get("group_size"), sole_group)
        group = self.made.get(key)
        if group is None:
            group = self.made[key] = _group_of(self.rank, meta, sole_group, self.by_name)
        return group


def _group_of(rank: RankTrace, meta: dict[str, Any], sole_group: bool,
              groups: dict[Any, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The collective's process group from its metadata; ``sole_group``: a collective of a
    c10d backend with no group metadata ran in the trace's only declared group (kernels of other
    libraries, e.g. DeepEP's, use their own communicators: their group stays unknown)."""
    name = meta.get("pg_name")
    ranks = meta.get("pg_ranks")
    desc = meta.get("pg_desc")
    size = meta.get("group_size")
    if name is not None:
        for pg in (groups if groups is not None else _groups_by_name(rank)).get(name, ()):
            ranks = ranks if ranks is not None else pg["ranks"]
            desc = desc or pg["description"]
            size = size or pg["size"]
    if sole_group and name is None and ranks is None and len(rank.process_groups) == 1:
        # The trace declares exactly one process group: every collective ran in it.
        pg = rank.process_groups[0]
        name, desc, ranks, size = pg["name"], pg["description"], pg["ranks"], size or pg["size"]
    if ranks is not None and size is None:
        size = len(ranks)
    return {"name": name, "description": desc, "ranks": ranks, "size": size}


def _cpu_side_collectives(rank: RankTrace, origin_ns: int) -> list[dict[str, Any]]:
    """CPU-only traces (gloo): the CPU ops that issue collectives are their only record.
    record_param_comms when the trace has it; else the ``c10d::*`` dispatcher ops (kind, sizes
    from Input Dims, step and phase) with the timing of gloo's own ``gloo:*`` work ranges, which
    run on its worker threads for the collective's real duration and carry the dtype: the n-th
    work range is the n-th op's (a process group runs its work in issue order) when they pair up
    one to one; else whichever of the two the trace has (c10d first). Each collective counts once."""
    m = rank.markers
    rows = np.flatnonzero(m.kind == Marker.COMM_PARAMS)
    work = rows
    if not len(rows):
        ops = np.flatnonzero(m.kind == Marker.COMM_OP)
        ops = ops[np.argsort(m.ts[ops], kind="stable")]
        names = [rank.strings[m.name[r]] for r in ops]
        c10d = np.array([r for r, n in zip(ops, names) if n.startswith("c10d::")], dtype=np.int64)
        gloo = np.array([r for r, n in zip(ops, names) if n.startswith("gloo:")], dtype=np.int64)
        rows = c10d if len(c10d) else gloo
        work = gloo if len(gloo) == len(c10d) or not len(c10d) else c10d
    if not len(rows):
        return []
    step, phase = locate(rank, m.ts[rows], m.thread[rows])
    out = []
    for k, row in enumerate(rows):
        name = rank.strings[m.name[row]]
        args = m.comm_args.get(int(row), {})
        if name == "record_param_comms":
            meta = _merge_sources(None, args, None, None, "")
        else:
            meta = _merge_sources(None, None, args, name, "")
        if meta["collective"] in ("unknown", "barrier"):
            continue
        done = int(work[k])
        if meta["dtype"] is None and done != row:  # the c10d op records no dtype; gloo's range does
            types = m.comm_args.get(done, {}).get("input_types")
            meta["dtype"] = sizes_from_input_dims(rank.strings[m.name[done]], [[1]], types)[2]
        dur = int(m.end[done] - m.ts[done])
        out.append(_row(rank.rank, meta, _group_of(rank, meta, True),
                        step=int(step[k]) if step[k] != NO_STEP else None, phase=PHASES[phase[k]], stream=None,
                        start_us=round((int(m.ts[done]) - origin_ns) / 1000.0, 3), dur_us=round(dur / 1000.0, 3),
                        exposed_us=None, launch_us=round((int(m.ts[row]) - origin_ns) / 1000.0, 3), kernel=None,
                        library=_cpu_library(rank, name),
                        module=_module_at(rank, m.ts[row:row + 1], m.thread[row:row + 1]), on_gpu=False))
        if meta["collective"] in p2p.P2P_KINDS:
            _set_peers(out[-1], rank.rank, meta, None if name == "record_param_comms" else name, args)
    return out


def _cpu_library(rank: RankTrace, op_name: str) -> str | None:
    """The backend of a CPU-side collective: the op's prefix (gloo:, mpi:, ucc:), else the
    trace's single backend; None when the trace does not say."""
    prefix = op_name.split(":", 1)[0]
    if prefix in ("gloo", "mpi", "ucc", "nccl"):
        return prefix
    backend = (rank.backend or "").lower()
    return backend if backend and backend.isidentifier() else None


def _module_at(rank: RankTrace, ts: np.ndarray, thread: np.ndarray) -> str | None:
    row = _module_markers(rank, ts, thread)[0]
    return fsdp_module_of(rank.strings[rank.markers.name[row]]) if row >= 0 else None


def fsdp_units(collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FSDP units: all-gathers (forward and backward) and reduce-scatters of a step, in order,
    named by the FSDP2 module annotation when present."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for row in collectives:
        if row["collective"] in ("allgather", "reduce_scatter"):
            key = (row["rank"], row["step"], row["phase"], row["collective"])
            by_key.setdefault(key, []).append(row)
    units = []
    for (rank, step, phase, coll), rows in sorted(by_key.items(),
                                                  key=lambda kv: (kv[0][0], _step_key(kv[0][1]), str(kv[0][2]), kv[0][3])):
        rows.sort(key=lambda r: r["start_us"])
        for index, row in enumerate(rows):
            units.append({"rank": rank, "step": step, "phase": phase, "collective": coll,
                          "index": index, "module": row["module"], "bytes": row["bytes"],
                          "start_us": row["start_us"], "dur_us": row["dur_us"],
                          "exposed_us": row["exposed_us"], "on_gpu": row["on_gpu"]})
    return units


def _step_key(step: Any) -> tuple[int, int]:
    return (0, step) if isinstance(step, int) else (1, 0)


def share_groups(rows: list[dict[str, Any]]) -> None:
    """Give equal ``group`` dicts (same keys in the same order, same values) one object: every
    row of a group held its own copy, member list included (kilobytes per row at 1,000 ranks).
    Each group object is compared once (rows mostly share them already: the map shares its
    rank's), and only the rows whose object is replaced are written."""
    groups = list(map(dict.get, rows, repeat("group")))  # held: their ids stay unique
    replaced = shared_groups(list(dict(zip(map(id, groups), groups)).values()))
    if replaced:
        for row, ident in zip(rows, map(id, groups)):
            if ident in replaced:
                row["group"] = replaced[ident]


def shared_groups(groups: list[Any]) -> dict[int, dict[str, Any]]:
    """{id of a group object: the equal one (same keys in the same order, same values) that
    came before it} of distinct objects in order of first appearance (empty ones left as
    they are)."""
    by_name: dict[tuple[str, str], list[dict[str, Any]]] = {}
    replaced: dict[int, dict[str, Any]] = {}
    for group in groups:
        if not group:
            continue
        # str(): a hostile trace's name may be a list (unhashable); equality decides below
        candidates = by_name.setdefault((str(group.get("name")), str(group.get("size"))), [])
        shared = next((c for c in candidates if c == group and list(c) == list(group)), None)
        if shared is None:
            candidates.append(group)
        else:
            replaced[id(group)] = shared
    return replaced
