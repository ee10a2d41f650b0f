"""FLOPs of every op from its recorded shapes, and the GPU time of its kernels, per step
(issue 29; models.md §6).

Only leaf ops count: an op whose FLOPs analyzer.ingest.shapes keeps shapes for, with no other
such op inside it on its thread (``aten::matmul`` counts through the ``aten::mm`` it calls,
``aten::linear`` through ``aten::addmm``, an autocast ``aten::linear`` through the one it
wraps; backward ops are ops like any other). An op's kernels are the GPU work launched while it
ran on its thread (the launch found through the kernel's correlation id, as every GPU event is
placed: analyzer.rank.timeline), so the kernels of the ops it calls (a contiguous copy, the
cuBLAS workspace memset) are its own; its GPU time is the sum of its compute kernels' durations.

Each distinct (op, recorded arguments) is worked out once (``count_op``, cached): the text of
``Input Dims``, ``Input type`` and ``Concrete Inputs`` is parsed there, not per event. Ops
whose shapes are missing or do not make sense are counted as unknown, with their GPU time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from analyzer.base import arrays
from analyzer.ingest.shapes import ATTENTION_OPS, CONV_OPS, GEMM_OPS, OTHER_OPS, ShapeOps
from analyzer.ingest.trace import GpuEvents, GpuKind, RankTrace
from analyzer.model import formulas as models
from analyzer.rank.timeline import NO_STEP, steps_of_points

FAMILIES = ("gemm", "attention", "conv", "other")
FAMILY_OF = {**dict.fromkeys(GEMM_OPS, "gemm"), **dict.fromkeys(ATTENTION_OPS, "attention"),
             **dict.fromkeys(CONV_OPS, "conv"), **dict.fromkeys(OTHER_OPS, "other")}
COMPUTE_STEPS_VERSION = 1
MAX_SHAPES_PER_STEP = 256  # distinct shapes kept per step; the rest merged per (op, dtype)
_MAX_DIM = 1 << 40  # a larger size is not a tensor a job ran: the shapes are unknown
_MAX_WINDOW_ROWS = 1 << 22
# cuBLAS / CUTLASS / cuDNN names of fp32 work on TF32 tensor cores ("s1688", "s16816": the
# TF32 MMA shapes; "tf32" in xmma / cudnn names).
_TF32_KERNEL = re.compile(r"tf32|s1688|s16816", re.IGNORECASE)
_DTYPE_NAMES = {
    "float": "fp32", "c10::float": "fp32", "float32": "fp32", "torch.float32": "fp32",
    "double": "fp64", "torch.float64": "fp64",
    "c10::half": "fp16", "half": "fp16", "torch.float16": "fp16",
    "c10::bfloat16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}


def dtype_name(recorded: Any) -> str | None:
    """The short dtype of an ``Input type`` entry: fp32, tf32 is decided by the kernels, bf16,
    fp16, fp8 (every ``c10::Float8_*``), fp64; other types lower-cased; None when not a type."""
    if not isinstance(recorded, str) or not recorded or recorded in ("Scalar", "ScalarList", "TensorList"):
        return None
    lowered = recorded.lower()
    if lowered in _DTYPE_NAMES:
        return _DTYPE_NAMES[lowered]
    if "float8" in lowered:
        return "fp8"
    return lowered.rsplit("::", 1)[-1].replace(" ", "_")


@dataclass(frozen=True)
class OpCount:
    """What one op's recorded arguments say: its family, FLOPs (None: unknown, ``reason``
    says why), the dtype of its operands, the sizes its FLOPs follow from, and a note on what
    was assumed (an attention whose causal flag was not recorded counts as full)."""

    family: str
    flops: float | None
    dtype: str | None
    dims: dict[str, Any] | None = None
    reason: str | None = None
    note: str | None = None


class _Unknown(Exception):
    """The recorded arguments do not give this op's FLOPs (the message says why)."""


@lru_cache(maxsize=1 << 14)
def count_op(name: str, recorded: tuple[bytes, bytes, bytes]) -> OpCount:
    """FLOPs of op ``name`` with these recorded ``(Input Dims, Input type, Concrete Inputs)``
    texts (analyzer.ingest.shapes), worked out once per distinct combination."""
    family = FAMILY_OF.get(name, "other")
    dims_text, types_text, concrete_text = recorded
    if not dims_text:
        return OpCount(family, None, None, reason="no shapes recorded (profile with record_shapes=True)")
    try:
        args = _Args(_parsed(dims_text), _parsed(types_text), _parsed(concrete_text))
        count = _COUNTERS[name](args)
    except _Unknown as exc:
        return OpCount(family, None, None, reason=f"{name}: {exc}")
    flops, dims = count[0], count[1]
    note = count[2] if len(count) > 2 else None
    if not np.isfinite(flops) or flops < 0 or flops > 2.0**62:
        return OpCount(family, None, None, reason=f"{name}: implausible FLOP count from its shapes")
    family = dims.pop("family", family)
    return OpCount(family, _exact(flops), args.dtype(dims.pop("operand", 0)), dims, None, note)


def _exact(flops: float) -> float:
    """An int when the count is whole (sums of them stay exact), else the float."""
    return int(flops) if float(flops).is_integer() else float(flops)


def _parsed(text: bytes) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None


class _Args:
    """One op's parsed recorded arguments, read defensively (the trace is untrusted)."""

    def __init__(self, dims: Any, types: Any, concrete: Any) -> None:
        if not isinstance(dims, list):
            raise _Unknown("Input Dims is not a list")
        self.dims = dims
        self.types = types if isinstance(types, list) else []
        self.concrete = concrete if isinstance(concrete, list) else None
        self.n = len(dims)

    def tensor(self, i: int) -> list[int]:
        """The sizes of argument ``i`` (a tensor; [] for a scalar or an absent optional one)."""
        if i >= self.n:
            raise _Unknown(f"{self.n} recorded arguments, argument {i} expected")
        sizes = self.dims[i]
        if not isinstance(sizes, list) or not all(type(s) is int and 0 <= s < _MAX_DIM for s in sizes):
            raise _Unknown(f"argument {i} is not a tensor's sizes: {str(sizes)[:40]}")
        return sizes

    def present(self, i: int) -> bool:
        """Whether optional tensor argument ``i`` was given (recorded with sizes)."""
        return i < self.n and isinstance(self.dims[i], list) and len(self.dims[i]) > 0

    def dtype(self, i: int) -> str | None:
        return dtype_name(self.types[i]) if i < len(self.types) else None

    def text(self, i: int) -> str | None:
        """Concrete input ``i`` (a scalar or an int list as text), None when not recorded."""
        if self.concrete is None or i >= len(self.concrete) or not isinstance(self.concrete[i], str):
            return None
        return self.concrete[i] or None

    def flag(self, i: int) -> bool | None:
        value = self.text(i)
        return {"True": True, "False": False, "1": True, "0": False}.get(value) if value is not None else None

    def integer(self, i: int) -> int | None:
        value = self.text(i)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def int_list(self, i: int) -> list[int] | None:
        value = self.text(i)
        if value is None or not value.startswith("["):
            return None
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        if isinstance(parsed, list) and all(type(v) is int and abs(v) < _MAX_DIM for v in parsed):
            return parsed
        if isinstance(parsed, list) and all(isinstance(v, bool) for v in parsed):
            return [int(v) for v in parsed]
        return None

    def bool_list(self, i: int) -> list[bool] | None:
        value = self.text(i)
        if value is None:
            return None
        words = value.strip("[]").replace(" ", "").split(",")
        if not words or any(w not in ("True", "False") for w in words):
            return None
        return [w == "True" for w in words]


def _product(sizes: list[int]) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


# ---------------------------------------------------------------- matrix multiplies

def _gemm(batch: int, m: int, n: int, k: int, operand: int = 0, family: str = "gemm") -> tuple[float, dict]:
    return models.gemm_flops(batch, m, n, k), {"b": batch, "m": m, "n": n, "k": k, "operand": operand,
                                              "family": family}


def _mm_of(a: list[int], b: list[int], operand: int) -> tuple[float, dict]:
    if len(a) != 2 or len(b) != 2:
        raise _Unknown(f"matrices expected, got {len(a)}-D and {len(b)}-D")
    if a[1] != b[0]:
        raise _Unknown(f"inner sizes differ ({a[1]} and {b[0]})")
    return _gemm(1, a[0], b[1], a[1], operand)


def _bmm_of(a: list[int], b: list[int], operand: int) -> tuple[float, dict]:
    if len(a) != 3 or len(b) != 3:
        raise _Unknown(f"batches of matrices expected, got {len(a)}-D and {len(b)}-D")
    if a[0] != b[0] or a[2] != b[1]:
        raise _Unknown(f"sizes do not agree ({a} and {b})")
    return _gemm(a[0], a[1], b[2], a[2], operand)


def _mm(args: _Args) -> tuple[float, dict]:
    return _mm_of(args.tensor(0), args.tensor(1), 0)


def _addmm(args: _Args) -> tuple[float, dict]:  # (bias, mat1, mat2, beta, alpha)
    return _mm_of(args.tensor(1), args.tensor(2), 1)


def _bmm(args: _Args) -> tuple[float, dict]:
    return _bmm_of(args.tensor(0), args.tensor(1), 0)


def _baddbmm(args: _Args) -> tuple[float, dict]:  # (self, batch1, batch2, beta, alpha); addbmm sums the batch
    return _bmm_of(args.tensor(1), args.tensor(2), 1)


def _matmul(args: _Args) -> tuple[float, dict]:
    """torch.matmul's broadcasting: 1-D operands are a row / a column, batch sizes broadcast."""
    a, b = args.tensor(0), args.tensor(1)
    if not a or not b:
        raise _Unknown("a 0-D operand")
    if len(a) == 1 and len(b) == 1:
        if a[0] != b[0]:
            raise _Unknown(f"vector sizes differ ({a[0]} and {b[0]})")
        return _gemm(1, 1, 1, a[0], 0, "other")
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    k2, n = (b[0], 1) if len(b) == 1 else (b[-2], b[-1])
    if k != k2:
        raise _Unknown(f"inner sizes differ ({k} and {k2})")
    batch = _broadcast(a[:-2], b[:-2])
    vector = len(a) == 1 or len(b) == 1
    return _gemm(_product(batch), m, n, k, 0, "other" if vector and _product(batch) == 1 else "gemm")


def _broadcast(a: list[int], b: list[int]) -> list[int]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise _Unknown(f"batch sizes do not broadcast ({a} and {b})")
        out.append(x if y == 1 else y)
    return out[::-1]


def _linear(args: _Args) -> tuple[float, dict]:  # (input [..., K], weight [N, K], bias)
    x, w = args.tensor(0), args.tensor(1)
    if not x or len(w) not in (1, 2):
        raise _Unknown(f"input {x} and weight {w} are not a linear layer's")
    n, k = (1, w[0]) if len(w) == 1 else (w[0], w[1])
    if x[-1] != k:
        raise _Unknown(f"input features {x[-1]} and weight {w} differ")
    return _gemm(1, _product(x[:-1]), n, k, 0)


def _scaled_mm(args: _Args) -> tuple[float, dict]:  # (mat1, mat2, scale_a, scale_b, ...): fp8
    return _mm_of(args.tensor(0), args.tensor(1), 0)


def _grouped_mm(args: _Args) -> tuple[float, dict]:
    """``_grouped_mm(a, b, offs, ...)``: 2-D × 3-D (each row of a through its group's matrix),
    3-D × 3-D (a batch), 2-D × 2-D (groups split the inner size); 3-D × 2-D is not counted."""
    a, b = args.tensor(0), args.tensor(1)
    if len(a) == 2 and len(b) == 3:
        if a[1] != b[1]:
            raise _Unknown(f"inner sizes differ ({a[1]} and {b[1]})")
        flops, dims = _gemm(1, a[0], b[2], a[1], 0)
        return flops, {**dims, "groups": b[0]}
    if len(a) == 3 and len(b) == 3:
        return _bmm_of(a, b, 0)
    if len(a) == 2 and len(b) == 2:
        return _mm_of(a, b, 0)
    raise _Unknown(f"a {len(a)}-D × {len(b)}-D grouped product: the groups' sizes are not recorded")


def _mv(args: _Args) -> tuple[float, dict]:  # (matrix [M, N], vector [N])
    return _vector(args.tensor(0), args.tensor(1), 0)


def _addmv(args: _Args) -> tuple[float, dict]:  # (self, mat, vec, beta, alpha)
    return _vector(args.tensor(1), args.tensor(2), 1)


def _vector(a: list[int], v: list[int], operand: int) -> tuple[float, dict]:
    if len(a) != 2 or len(v) != 1 or a[1] != v[0]:
        raise _Unknown(f"a matrix and a vector expected, got {a} and {v}")
    return _gemm(1, a[0], 1, a[1], operand, "other")


def _dot(args: _Args) -> tuple[float, dict]:
    a, b = args.tensor(0), args.tensor(1)
    if len(a) != 1 or a != b:
        raise _Unknown(f"two vectors of one size expected, got {a} and {b}")
    return _gemm(1, 1, 1, a[0], 0, "other")


# ---------------------------------------------------------------- attention

@dataclass(frozen=True)
class _Attention:
    """Where an attention op's arguments are: ``layout`` of q/k/v ("bhsd": [..., heads, seq,
    dim], SDPA; "bshd": [batch, seq, heads, dim], the kernels' own), the query's index (k, v
    follow), the causal flag's index by number of recorded arguments (schemas grew across
    torch versions; an int: the same in all), an int mask type instead (efficient attention:
    0 none, 1 top-left causal, 2 bottom-right), the mask / bias argument, the varlen
    cumulative lengths, the sliding window's (left, right) arguments."""

    layout: str
    q: int
    causal: dict[int, int] | int | None = None
    mask_type: int | None = None
    mask: int | dict[int, int] | None = None
    varlen: int | None = None
    window: tuple[int, int] | None = None
    align: str = "top-left"
    backward: bool = False
    always_varlen: bool = False


_ATTENTION = {
    "aten::scaled_dot_product_attention": _Attention("bhsd", 0, causal=5, mask=3),
    "aten::_scaled_dot_product_flash_attention": _Attention("bhsd", 0, causal=4),
    "aten::_scaled_dot_product_flash_attention_backward": _Attention("bhsd", 1, causal=11, backward=True),
    # torch 2.0: (q, k, v, compute_log_sumexp, is_causal); 2.1+: (q, k, v, attn_bias, compute_log_sumexp,
    # dropout_p, is_causal, scale)
    "aten::_scaled_dot_product_efficient_attention": _Attention("bhsd", 0, causal={5: 4, 7: 6, 8: 6},
                                                               mask={7: 3, 8: 3}),
    # torch 2.0: (grad_out, q, k, v, out, logsumexp, is_causal, chunk_grad_outputs); 2.1+: 13 arguments
    "aten::_scaled_dot_product_efficient_attention_backward": _Attention("bhsd", 1, causal={8: 6, 12: 11, 13: 11},
                                                                        mask={12: 4, 13: 4}, backward=True),
    # before 2.5: (q, k, v, dropout_p, is_causal, return_debug_mask, scale)
    "aten::_scaled_dot_product_cudnn_attention": _Attention("bhsd", 0, causal={7: 4, 9: 6}, mask={9: 3}),
    "aten::_scaled_dot_product_cudnn_attention_backward": _Attention("bhsd", 1, causal={15: 11, 16: 14},
                                                                    mask={16: 8}, backward=True),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _Attention("bhsd", 0, causal=4, mask=5),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _Attention("bhsd", 1, causal=7, mask=8,
                                                                            backward=True),
    "aten::_flash_attention_forward": _Attention("bshd", 0, causal=8, varlen=3, window=(11, 12)),
    "aten::_flash_attention_backward": _Attention("bshd", 1, causal=11, varlen=6, window=(15, 16), backward=True),
    "aten::_efficient_attention_forward": _Attention("bshd", 0, mask_type=9, mask=3, varlen=4),
    "aten::_efficient_attention_backward": _Attention("bshd", 1, mask_type=14, mask=4, varlen=6, backward=True),
}
for _ns in ("flashattn", "flash_attn"):
    _ATTENTION[f"{_ns}::_flash_attn_forward"] = _Attention("bshd", 0, causal=5, window=(6, 7), align="bottom-right")
    _ATTENTION[f"{_ns}::_flash_attn_backward"] = _Attention("bshd", 1, causal=11, window=(12, 13),
                                                            align="bottom-right", backward=True)
    _ATTENTION[f"{_ns}::_flash_attn_varlen_forward"] = _Attention("bshd", 0, always_varlen=True)
    _ATTENTION[f"{_ns}::_flash_attn_varlen_backward"] = _Attention("bshd", 1, always_varlen=True, backward=True)


def _by_count(where: dict[int, int] | int | None, n: int) -> int | None:
    return where.get(n) if isinstance(where, dict) else where


def _attention(spec: _Attention, args: _Args) -> tuple[float, dict, str | None]:
    if spec.always_varlen or (spec.varlen is not None and args.present(spec.varlen)):
        raise _Unknown("variable-length batch: the sequence lengths are in a tensor the profiler does not record")
    q, k, v = args.tensor(spec.q), args.tensor(spec.q + 1), args.tensor(spec.q + 2)
    if spec.layout == "bhsd":
        if len(q) < 2 or len(k) < 2 or len(v) < 2:
            raise _Unknown(f"query {q}, key {k}, value {v} are not [..., seq, dim]")
        batch_heads, sq, sk = _product(q[:-2]), q[-2], k[-2]
    else:
        if len(q) < 3 or len(k) < 3 or len(v) < 3:
            raise _Unknown(f"query {q}, key {k}, value {v} are not [batch, seq, heads, dim]")
        batch_heads, sq, sk = _product(q[:-3]) * q[-2], q[-3], k[-3]
    d_qk, d_v = q[-1], v[-1]
    if k[-1] != d_qk:
        raise _Unknown(f"query and key head sizes differ ({d_qk} and {k[-1]})")
    causal, align, note = _causal(spec, args)
    visible = 1.0
    if sq and sk:
        window = _window(spec, args)
        if window is not None:
            if sq > _MAX_WINDOW_ROWS:
                raise _Unknown(f"implausible sequence length {sq}")
            visible = models.window_visible_fraction(sq, sk, window[0], window[1], bool(causal), align)
        elif causal:
            visible = models.causal_visible_fraction(sq, sk, align)
    flops = models.attention_flops(batch_heads, sq, sk, d_qk, d_v, visible, spec.backward)
    dims = {"bh": batch_heads, "sq": sq, "sk": sk, "d": d_qk, "dv": d_v, "causal": causal,
            "backward": spec.backward, "operand": spec.q}
    return flops, dims, note


def _causal(spec: _Attention, args: _Args) -> tuple[bool | None, str, str | None]:
    """(causal or None when not recorded, the mask's alignment, the note saying so)."""
    mask = _by_count(spec.mask, args.n)
    if spec.mask_type is not None:
        kind = args.integer(spec.mask_type)
        if kind is None:
            return None, spec.align, "mask type not recorded (no Concrete Inputs): counted as full attention"
        return kind in (1, 2), ("bottom-right" if kind == 2 else "top-left"), None
    index = _by_count(spec.causal, args.n)
    if index is None:
        return None, spec.align, f"causal flag not where expected ({args.n} arguments): counted as full attention"
    causal = args.flag(index)
    if causal is None:
        return None, spec.align, "causal flag not recorded (no Concrete Inputs): counted as full attention"
    if causal and mask is not None and args.present(mask):
        return False, spec.align, "an explicit mask: counted as full attention"
    return causal, spec.align, None


def _window(spec: _Attention, args: _Args) -> tuple[int | None, int | None] | None:
    if spec.window is None or spec.window[1] >= args.n:
        return None
    left, right = args.integer(spec.window[0]), args.integer(spec.window[1])
    if (left is None or left < 0) and (right is None or right < 0):
        return None
    return left, right


# ---------------------------------------------------------------- convolution

def _convolution(args: _Args) -> tuple[float, dict, str | None]:
    """``convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups)`` (``_convolution`` adds flags after these)."""
    x, w = args.tensor(0), args.tensor(1)
    batch, spatial = _conv_input(x, w)
    transposed = args.flag(6)
    if transposed:
        return models.conv_flops(batch, spatial, _product(w)), _conv_dims(batch, spatial, w, True), None
    stride, padding, dilation = args.int_list(3), args.int_list(4), args.int_list(5)
    if stride is None or padding is None or dilation is None or transposed is None:
        raise _Unknown("stride, padding and dilation not recorded (no Concrete Inputs): the output size is unknown")
    rank = len(spatial)
    stride, padding, dilation = (_per_dim(values, rank) for values in (stride, padding, dilation))
    out = [models.conv_output_size(spatial[i], w[2 + i], stride[i], padding[i], dilation[i]) for i in range(rank)]
    return models.conv_flops(batch, out, _product(w)), _conv_dims(batch, out, w, False), None


def _convolution_backward(args: _Args) -> tuple[float, dict, str | None]:
    """``convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)``: each of the input and weight gradients
    costs the forward's FLOPs (the bias gradient, a sum, is left out)."""
    grad, x, w = args.tensor(0), args.tensor(1), args.tensor(2)
    transposed = args.flag(7)
    if transposed:
        batch, spatial = _conv_input(x, w)
    else:
        batch, spatial = _conv_input(grad, w)
    mask = args.bool_list(10)
    note = None
    if mask is None:
        passes, note = 2, "output_mask not recorded: the input and the weight gradients both counted"
    else:
        passes = sum(mask[:2])
    flops = passes * models.conv_flops(batch, spatial, _product(w))
    return flops, {**_conv_dims(batch, spatial, w, bool(transposed)), "passes": passes, "backward": True}, note


def _conv_input(x: list[int], w: list[int]) -> tuple[int, list[int]]:
    if len(w) < 3:
        raise _Unknown(f"weight {w} is not a convolution's")
    rank = len(w) - 2
    if len(x) == rank + 2:
        return x[0], x[2:]
    if len(x) == rank + 1:  # unbatched input
        return 1, x[1:]
    raise _Unknown(f"input {x} does not match weight {w}")


def _per_dim(values: list[int], rank: int) -> list[int]:
    if len(values) == rank:
        return values
    if len(values) == 1:
        return values * rank
    raise _Unknown(f"{values} for a {rank}-D convolution")


def _conv_dims(batch: int, spatial: list[int], w: list[int], transposed: bool) -> dict[str, Any]:
    return {"n": batch, "spatial": list(spatial), "weight": list(w), "transposed": transposed}


def _attention_counter(name: str):
    spec = _ATTENTION[name]
    return lambda args: _attention(spec, args)


_COUNTERS = {
    "aten::mm": _mm, "aten::addmm": _addmm, "aten::_addmm_activation": _addmm, "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm, "aten::addbmm": _baddbmm, "aten::matmul": _matmul, "aten::linear": _linear,
    "aten::_scaled_mm": _scaled_mm, "aten::_grouped_mm": _grouped_mm,
    "aten::mv": _mv, "aten::addmv": _addmv, "aten::dot": _dot, "aten::vdot": _dot,
    "aten::convolution": _convolution, "aten::_convolution": _convolution,
    "aten::convolution_backward": _convolution_backward,
    **{name: _attention_counter(name) for name in _ATTENTION},
}


# ---------------------------------------------------------------- the ops of one rank

def leaf_rows(ops: ShapeOps) -> np.ndarray:
    """Rows of the ops with no other kept op inside them on their thread. The rows are sorted
    by start (then longest first, then External id), so on a thread an op holds another one
    exactly when the next op on that thread starts before it ends (CPU ops nest)."""
    if not len(ops):
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((np.arange(len(ops)), ops.thread))  # each thread's rows, in row order
    ts, end, thread = ops.ts[order], ops.end[order], ops.thread[order]
    holds = np.zeros(len(order), dtype=bool)
    same = thread[1:] == thread[:-1]
    holds[:-1] = same & ((ts[1:] < end[:-1]) | (ts[1:] == ts[:-1]))
    return np.sort(order[~holds])


def kernel_owner(ops: ShapeOps, rows: np.ndarray, launch_ts: np.ndarray, launch_thread: np.ndarray) -> np.ndarray:
    """For each GPU event, the position in ``rows`` (leaf ops, which never nest) of the op that
    was running on its launch's thread when it was launched, or -1."""
    owner = np.full(len(launch_ts), -1, dtype=np.int64)
    if not len(rows) or not len(launch_ts):
        return owner
    threads = ops.thread[rows]
    for tid in arrays.unique(threads).tolist():
        mine = np.flatnonzero(threads == tid)  # ascending start: rows are sorted
        starts, ends = ops.ts[rows[mine]], ops.end[rows[mine]]
        query = np.flatnonzero(launch_thread == tid)
        if not len(query):
            continue
        at = launch_ts[query]
        idx = np.searchsorted(starts, at, side="right") - 1
        hit = (idx >= 0) & (at <= ends[np.maximum(idx, 0)])
        owner[query[hit]] = mine[idx[hit]]
    return owner


def compute_steps(trace: RankTrace, gpu: GpuEvents, launch_ts: np.ndarray, launch_thread: np.ndarray,
                  steps: tuple[int, ...] | None = None) -> dict[str, Any] | None:
    """The rank's FLOPs and their GPU time per ProfilerStep (``RankAnalysis.compute_steps``):
    per step, one row per distinct (op, shape, dtype) with its count, FLOPs, and the GPU time
    and count of its instances that launched kernels, and the unknown ops with their GPU time.
    None when the trace holds none of the ops (analyzer.ingest.shapes)."""
    ops = trace.shape_ops
    if not len(ops):
        return None
    rows = leaf_rows(ops)
    step = steps_of_points(trace, ops.ts[rows])
    if steps is not None:
        keep = np.isin(step, np.asarray(steps, dtype=np.int64))
        rows, step = rows[keep], step[keep]
    gpu_ns, kernels, tf32 = _kernel_time(ops, rows, gpu, launch_ts, launch_thread, trace.strings)
    pairs = ops.name[rows].astype(np.int64) * (len(ops.recorded) + 1) + ops.args[rows]
    distinct, which = np.unique(pairs, return_inverse=True)
    counts = [count_op(ops.names[int(p) // (len(ops.recorded) + 1)], ops.recorded[int(p) % (len(ops.recorded) + 1)])
              for p in distinct.tolist()]
    names = [ops.names[int(p) // (len(ops.recorded) + 1)] for p in distinct.tolist()]
    return {"version": COMPUTE_STEPS_VERSION,
            "ops_seen": _ops_seen(ops),
            "leaf_ops": int(len(rows)),
            "steps": _per_step(step, which.reshape(-1), counts, names, gpu_ns, kernels, tf32,
                               (ops.end[rows] - ops.ts[rows]))}


def _ops_seen(ops: ShapeOps) -> dict[str, int]:
    ids, counts = np.unique(ops.name, return_counts=True)
    return {ops.names[i]: int(n) for i, n in sorted(zip(ids.tolist(), counts.tolist()), key=lambda t: ops.names[t[0]])}


def _kernel_time(ops: ShapeOps, rows: np.ndarray, gpu: GpuEvents, launch_ts: np.ndarray, launch_thread: np.ndarray,
                 strings: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per leaf op: the summed duration (ns) of its compute kernels, their number, and how many
    of them ran fp32 on TF32 tensor cores (from the kernel names)."""
    compute = np.flatnonzero(gpu.kind == GpuKind.COMPUTE)
    owner = kernel_owner(ops, rows, launch_ts[compute], launch_thread[compute])
    mine = owner >= 0
    owned, events = owner[mine], compute[mine]
    size = len(rows)
    durations = (gpu.end[events] - gpu.ts[events]).astype(np.float64)
    gpu_ns = np.bincount(owned, weights=durations, minlength=size) if len(owned) else np.zeros(size)
    kernels = np.bincount(owned, minlength=size) if len(owned) else np.zeros(size, dtype=np.int64)
    names = gpu.name[events]
    present = arrays.unique(names).tolist()
    table = np.zeros(max(present, default=0) + 1, dtype=bool)
    table[present] = [_TF32_KERNEL.search(strings[n]) is not None for n in present]
    flagged = table[names] if len(names) else np.zeros(0, dtype=bool)
    tf32 = np.bincount(owned[flagged], minlength=size) if flagged.any() else np.zeros(size, dtype=np.int64)
    return gpu_ns, kernels, tf32


def _per_step(step: np.ndarray, which: np.ndarray, counts: list[OpCount], names: list[str], gpu_ns: np.ndarray,
              kernels: np.ndarray, tf32: np.ndarray, cpu_ns: np.ndarray) -> dict[str, Any]:
    """Per step (str(number); "none" for ops outside every step): the shape rows and unknown
    ops. The ops are grouped by (step, distinct op, on TF32) in array passes; Python runs once
    per group."""
    if not len(step):
        return {}
    # fp32 work on TF32 tensor cores counts against the TF32 peak (an op whose kernels say so)
    variant = (tf32 > 0).astype(np.int64)
    keys = np.stack([step, which.astype(np.int64), variant])
    groups, group_of = np.unique(keys, axis=1, return_inverse=True)
    group_of = group_of.reshape(-1)
    timed = (kernels > 0).astype(np.int64)
    n = groups.shape[1]
    count = np.bincount(group_of, minlength=n)
    timed_count = np.bincount(group_of, weights=timed, minlength=n).astype(np.int64)
    gpu_us = np.bincount(group_of, weights=gpu_ns, minlength=n) / 1000.0
    cpu_us = np.bincount(group_of, weights=cpu_ns.astype(np.float64), minlength=n) / 1000.0
    out: dict[str, Any] = {}
    for g in range(n):
        number, distinct, on_tf32 = (int(v) for v in groups[:, g])
        entry = out.setdefault("none" if number == NO_STEP else str(number),
                               {"shapes": [], "unknown": {"ops": 0, "timed_ops": 0, "gpu_us": 0.0, "by_reason": {}}})
        op = counts[distinct]
        if op.flops is None:
            unknown = entry["unknown"]
            unknown["ops"] += int(count[g])
            unknown["timed_ops"] += int(timed_count[g])
            unknown["gpu_us"] += float(gpu_us[g])
            unknown["by_reason"][op.reason] = unknown["by_reason"].get(op.reason, 0) + int(count[g])
            continue
        entry["shapes"].append({
            "op": names[distinct], "family": op.family, "dtype": "tf32" if on_tf32 and op.dtype == "fp32" else op.dtype,
            "dims": op.dims, "flops_each": op.flops, "count": int(count[g]), "flops": op.flops * int(count[g]),
            "timed_count": int(timed_count[g]), "timed_flops": op.flops * int(timed_count[g]),
            "gpu_us": round(float(gpu_us[g]), 3), "cpu_us": round(float(cpu_us[g]), 3), "note": op.note})
    for entry in out.values():
        unknown = entry["unknown"]
        unknown["gpu_us"] = round(unknown["gpu_us"], 3)
        unknown["by_reason"] = dict(sorted(unknown["by_reason"].items()))
        entry["shapes"] = _capped(sorted(entry["shapes"], key=_shape_order))
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "none", int(kv[0]) if kv[0] != "none" else 0)))


def _shape_order(row: dict[str, Any]) -> tuple:
    return (-row["gpu_us"], -row["flops"], row["op"], json.dumps(row["dims"], sort_keys=True), str(row["dtype"]))


def _capped(shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_SHAPES_PER_STEP rows: the rest (least GPU time) merged per (op, family,
    dtype), their sizes dropped."""
    if len(shapes) <= MAX_SHAPES_PER_STEP:
        return shapes
    kept, rest = shapes[:MAX_SHAPES_PER_STEP - 1], shapes[MAX_SHAPES_PER_STEP - 1:]
    merged: dict[tuple, dict[str, Any]] = {}
    for row in rest:
        key = (row["op"], row["family"], row["dtype"])
        into = merged.setdefault(key, {"op": row["op"], "family": row["family"], "dtype": row["dtype"], "dims": None,
                                       "flops_each": None, "count": 0, "timed_count": 0, "timed_flops": 0,
                                       "gpu_us": 0.0, "cpu_us": 0.0, "flops": 0, "note": "several shapes merged"})
        for field in ("count", "timed_count", "timed_flops", "gpu_us", "cpu_us", "flops"):
            into[field] += row[field]
    for row in merged.values():
        row["gpu_us"], row["cpu_us"] = round(row["gpu_us"], 3), round(row["cpu_us"], 3)
    return kept + sorted(merged.values(), key=lambda r: (-r["gpu_us"], r["op"], str(r["dtype"])))
