"""FLOPs from recorded shapes (issue 29, models.md §6): each op's count worked by hand from its
arguments as the profiler records them (torch 2.13's schemas, and older ones), leaf selection on
nested ops, and the kernels an op owns."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest.shapes import SHAPE_OP_NAMES, ShapeOps
from analyzer.model import formulas as models
from analyzer.rank.flops import _COUNTERS, count_op, dtype_name, kernel_owner, leaf_rows


def rec(dims, types=None, concrete=None):
    """The recorded (Input Dims, Input type, Concrete Inputs) texts of one op."""
    types = types if types is not None else ["float" if d else "" for d in dims]
    enc = [json.dumps(x).encode() if x is not None else b"" for x in (dims, types, concrete)]
    return tuple(enc)


def test_every_kept_name_has_a_formula():
    assert set(_COUNTERS) == set(SHAPE_OP_NAMES)


@pytest.mark.parametrize("name,dims,flops", [
    # the H200 recording's ops: aten::mm [M,K]x[K,N]
    ("aten::mm", [[4088, 8192], [8192, 1024]], 2 * 4088 * 1024 * 8192),
    # addmm(bias, mat1, mat2, beta, alpha): the bias is not a matrix operand
    ("aten::addmm", [[4096], [4088, 1024], [1024, 4096], [], []], 2 * 4088 * 4096 * 1024),
    # linear(input [..., K], weight [N, K] (transposed), bias): rows = all leading dims
    ("aten::linear", [[8, 511, 1024], [4096, 1024], [4096]], 2 * 8 * 511 * 4096 * 1024),
    ("aten::linear", [[1024], [10, 1024], []], 2 * 10 * 1024),
    ("aten::bmm", [[16, 16, 27], [16, 27, 27]], 2 * 16 * 16 * 27 * 27),
    ("aten::baddbmm", [[1, 4, 5], [3, 4, 6], [3, 6, 5], [], []], 2 * 3 * 4 * 5 * 6),
    ("aten::addbmm", [[4, 5], [3, 4, 6], [3, 6, 5], [], []], 2 * 3 * 4 * 5 * 6),
    # matmul broadcasting: [3,1,4,5] @ [6,5,2] -> batch [3,6]
    ("aten::matmul", [[3, 1, 4, 5], [6, 5, 2]], 2 * 18 * 4 * 2 * 5),
    ("aten::matmul", [[4], [3, 4, 2]], 2 * 3 * 1 * 2 * 4),  # a vector against a batch
    ("aten::matmul", [[7, 4], [4]], 2 * 7 * 4),  # matrix-vector
    ("aten::matmul", [[4], [4]], 2 * 4),  # dot
    ("aten::mm", [[0, 8], [8, 4]], 0),  # an empty batch is known: no FLOPs
    ("aten::_scaled_mm", [[128, 256], [256, 64], [], [], [], [], [], []], 2 * 128 * 64 * 256),
    ("aten::_grouped_mm", [[96, 64], [4, 64, 32], [4], [], []], 2 * 96 * 64 * 32),
    ("aten::_grouped_mm", [[4, 8, 64], [4, 64, 32], [], [], []], 2 * 4 * 8 * 32 * 64),
    ("aten::mv", [[7, 4], [4]], 2 * 7 * 4),
    ("aten::addmv", [[7], [7, 4], [4], [], []], 2 * 7 * 4),
    ("aten::dot", [[9], [9]], 18),
])
def test_matrix_products(name, dims, flops):
    count = count_op(name, rec(dims))
    assert count.reason is None and count.flops == flops
    assert isinstance(count.flops, int)


def test_dims_of_a_gemm_and_its_dtype():
    count = count_op("aten::addmm", rec([[4096], [4088, 1024], [1024, 4096], [], []],
                                        ["c10::BFloat16"] * 3 + ["Scalar"] * 2, ["", "", "", "1", "1"]))
    assert (count.family, count.dtype, count.dims) == ("gemm", "bf16", {"b": 1, "m": 4088, "n": 4096, "k": 1024})
    assert count_op("aten::matmul", rec([[4], [4]])).family == "other"
    assert count_op("aten::_scaled_mm", rec([[16, 32], [32, 16]], ["c10::Float8_e4m3fn"] * 2)).dtype == "fp8"


@pytest.mark.parametrize("name,dims,why", [
    ("aten::mm", [[2, 3], [4, 5]], "inner sizes differ"),
    ("aten::bmm", [[2, 3, 4], [3, 4, 5]], "sizes do not agree"),
    ("aten::matmul", [[2, 3, 4], [5, 4, 6]], "do not broadcast"),
    ("aten::mm", [[2, 3]], "argument 1 expected"),
    ("aten::mm", [[2.5, 3], [3, 4]], "not a tensor's sizes"),
    ("aten::mm", [[-2, 3], [3, 4]], "not a tensor's sizes"),
    ("aten::mm", [[True, 3], [3, 4]], "not a tensor's sizes"),
    ("aten::mm", [[10**15, 3], [3, 4]], "not a tensor's sizes"),  # implausible
    ("aten::_grouped_mm", [[4, 8, 64], [64, 32], [], [], []], "groups' sizes are not recorded"),
])
def test_shapes_that_do_not_make_sense_are_unknown(name, dims, why):
    count = count_op(name, rec(dims))
    assert count.flops is None and why in count.reason and count.reason.startswith(name)


def test_missing_or_broken_recordings_are_unknown():
    assert "record_shapes=True" in count_op("aten::mm", (b"", b"", b"")).reason
    assert count_op("aten::mm", (b"[[1, 2], [2", b"", b"")).flops is None  # cut text
    assert count_op("aten::mm", (b"[" * 100000 + b"]" * 100000, b"", b"")).flops is None  # deep nesting
    assert count_op("aten::mm", (b'{"a": 1}', b"", b"")).flops is None


def sdpa_dims(q, k=None, v=None, extra=0):
    return [q, k or q, v or q] + [[]] * extra


# -------------------------------------------------------------------- attention

def test_sdpa_on_cpu_causal_as_recorded_by_torch_2_13():
    # aten::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask, scale)
    q = [2, 4, 64, 32]
    dims = sdpa_dims(q, extra=4)
    types = ["float"] * 3 + ["Scalar", "Scalar", "", ""]
    causal = count_op("aten::_scaled_dot_product_flash_attention_for_cpu", rec(dims, types, ["", "", "", "0.", "True", "", ""]))
    full = count_op("aten::_scaled_dot_product_flash_attention_for_cpu", rec(dims, types, ["", "", "", "0.", "False", "", ""]))
    assert full.flops == 4 * 2 * 4 * 64 * 64 * 32 and causal.flops == full.flops // 2
    assert causal.dims["causal"] is True and full.note is None
    unknown = count_op("aten::_scaled_dot_product_flash_attention_for_cpu", rec(dims, types))  # no Concrete Inputs
    assert unknown.flops == full.flops and "counted as full" in unknown.note


def test_attention_backward_is_two_and_a_half_forwards():
    # (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale)
    q = [2, 4, 64, 32]
    dims = [q, q, q, q, q, [2, 4, 64], [], [], [], []]
    concrete = ["", "", "", "", "", "", "0.", "True", "", ""]
    count = count_op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", rec(dims, None, concrete))
    assert count.flops == 2.5 * 4 * 2 * 4 * 64 * 64 * 32 / 2 and count.dims["backward"] is True


def test_flash_kernels_own_layout_and_gqa():
    # aten::_flash_attention_forward: [batch, seq, heads, dim]; 8 query heads over 2 kv heads
    q, k = [2, 128, 8, 64], [2, 128, 2, 64]
    dims = [q, k, k] + [[]] * 13
    concrete = [""] * 8 + ["True"] + [""] * 7
    count = count_op("aten::_flash_attention_forward", rec(dims, None, concrete))
    assert count.flops == 4 * 2 * 8 * 128 * 128 * 64 // 2
    varlen = [[256, 8, 64], [256, 2, 64], [256, 2, 64], [3], [3]] + [[]] * 11
    assert "variable-length" in count_op("aten::_flash_attention_forward", rec(varlen)).reason


def test_head_sizes_of_query_and_value_may_differ():
    q, v = [1, 2, 16, 192], [1, 2, 16, 128]
    count = count_op("aten::_scaled_dot_product_flash_attention", rec([q, q, v, [], [], [], []], None,
                                                                      ["", "", "", "0.", "False", "False", ""]))
    assert count.flops == 2 * 2 * 16 * 16 * (192 + 128)


def test_flash_attn_custom_op_bottom_right_causal_and_window():
    # flashattn::_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_left, window_right, ...)
    q, k = [1, 64, 4, 32], [1, 256, 4, 32]
    dims = [q, k, k] + [[]] * 8
    causal = count_op("flashattn::_flash_attn_forward", rec(dims, None, ["", "", "", "0.", "0.1", "True", "-1", "-1"]))
    assert causal.flops == pytest.approx(4 * 4 * 64 * 256 * 32 * (1 - 64 / (2 * 256)))
    window = count_op("flashattn::_flash_attn_forward", rec(dims, None, ["", "", "", "0.", "0.1", "True", "15", "0"]))
    assert window.flops == 4 * 4 * 64 * 16 * 32  # every query sees 16 keys (its own and 15 before)


def test_efficient_attention_schemas_across_versions():
    q = [2, 4, 64, 32]
    new = count_op("aten::_scaled_dot_product_efficient_attention",
                   rec(sdpa_dims(q, extra=5), None, ["", "", "", "", "True", "0.", "True", ""]))
    old = count_op("aten::_scaled_dot_product_efficient_attention", rec(sdpa_dims(q, extra=2), None, ["", "", "", "True", "True"]))
    assert new.flops == old.flops == 4 * 2 * 4 * 64 * 64 * 32 // 2
    biased = count_op("aten::_scaled_dot_product_efficient_attention",
                      rec([q, q, q, [2, 4, 64, 64], [], [], [], []], None, ["", "", "", "", "True", "0.", "True", ""]))
    assert biased.flops == 4 * 2 * 4 * 64 * 64 * 32 and "explicit mask" in biased.note


def test_causal_fraction_is_the_triangle():
    assert models.causal_visible_fraction(64, 64) == 0.5
    assert models.causal_visible_fraction(32, 64) == 0.25  # top-left: query i sees i + 1 keys
    assert models.causal_visible_fraction(32, 64, "bottom-right") == 0.75
    assert models.window_visible_fraction(4, 4, 1, 0, True) == pytest.approx(7 / 16)


# -------------------------------------------------------------------- convolution

def conv_dims(x, w, rank=2):
    return [x, w, []] + [[]] * 6


def test_convolution_output_size_from_concrete_inputs():
    # the CPU recording: conv2d(x [2,3,16,16], w [8,3,3,3], stride 2, padding 1) -> out 8x8
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    count = count_op("aten::convolution", rec(conv_dims([2, 3, 16, 16], [8, 3, 3, 3]), None, concrete))
    assert count.flops == 2 * 2 * 8 * 8 * (8 * 3 * 3 * 3)
    assert count.dims["spatial"] == [8, 8] and count.family == "conv"
    assert "no Concrete Inputs" in count_op("aten::convolution", rec(conv_dims([2, 3, 16, 16], [8, 3, 3, 3]))).reason


def test_grouped_and_transposed_convolution():
    # depthwise: groups 8, weight [8, 1, 3, 3]; the weight's size already holds C_in / groups
    concrete = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "8"]
    count = count_op("aten::convolution", rec(conv_dims([1, 8, 10, 10], [8, 1, 3, 3]), None, concrete))
    assert count.flops == 2 * 1 * 100 * (8 * 9)
    # transposed: each input point scatters through weight [C_in, C_out/g, k]
    concrete_t = ["", "", "", "[2]", "[0]", "[1]", "True", "[0]", "1"]
    count_t = count_op("aten::_convolution", rec([[4, 6, 20], [6, 5, 3]] + [[]] * 11, None, concrete_t + [""] * 4))
    assert count_t.flops == 2 * 4 * 20 * (6 * 5 * 3)


def test_convolution_backward_counts_the_gradients_asked_for():
    dims = [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]] + [[]] * 8
    concrete = ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    both = count_op("aten::convolution_backward", rec(dims, None, concrete))
    assert both.flops == 2 * (2 * 2 * 64 * 216)
    weight_only = count_op("aten::convolution_backward", rec(dims, None, concrete[:-1] + ["[False, True, True]"]))
    assert weight_only.flops == 2 * 2 * 64 * 216
    unknown_mask = count_op("aten::convolution_backward", rec(dims))
    assert unknown_mask.flops == both.flops and "both counted" in unknown_mask.note


def test_dtype_names():
    assert [dtype_name(t) for t in ("float", "c10::BFloat16", "c10::Half", "double", "c10::Float8_e5m2",
                                    "long int", "Scalar", "")] == \
        ["fp32", "bf16", "fp16", "fp64", "fp8", "long_int", None, None]


# -------------------------------------------------------------------- leaf ops and their kernels

def ops_of(rows):
    """ShapeOps from (ts, end, thread, name, external id) rows, sorted as the ingest sorts them."""
    rows = sorted(rows, key=lambda r: (r[0], -r[1], r[4]))
    names = sorted({r[3] for r in rows})
    cols = list(zip(*rows))
    return ShapeOps(np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int64),
                    np.array(cols[2], dtype=np.int32), np.array([names.index(n) for n in cols[3]], dtype=np.int32),
                    np.zeros(len(rows), dtype=np.int32), np.array(cols[4], dtype=np.int64), names, [(b"", b"", b"")])


def test_leaf_ops_only():
    ops = ops_of([
        (0, 100, 0, "aten::linear", 1), (10, 90, 0, "aten::addmm", 2),     # linear -> addmm
        (200, 300, 0, "aten::linear", 3), (210, 290, 0, "aten::linear", 4), (220, 280, 0, "aten::addmm", 5),  # autocast
        (400, 500, 0, "aten::matmul", 6), (400, 500, 0, "aten::mm", 7),    # same µs times: the caller's id first
        (600, 700, 0, "aten::mm", 8), (700, 750, 0, "aten::mm", 9),       # siblings that touch
        (50, 60, 1, "aten::mm", 10),                                         # another thread, inside in time only
    ])
    leaves = [(int(ops.ts[r]), int(ops.external_id[r])) for r in leaf_rows(ops)]
    assert leaves == [(10, 2), (50, 10), (220, 5), (400, 7), (600, 8), (700, 9)]


def test_kernels_belong_to_the_op_running_at_their_launch():
    ops = ops_of([(0, 100, 0, "aten::mm", 1), (200, 300, 0, "aten::mm", 2), (0, 100, 1, "aten::mm", 3)])
    rows = leaf_rows(ops)
    launch_ts = np.array([5, 100, 150, 250, 50, 50], dtype=np.int64)
    launch_thread = np.array([0, 0, 0, 0, 1, -1], dtype=np.int32)
    owner = kernel_owner(ops, rows, launch_ts, launch_thread)
    mine = [int(ops.external_id[rows[o]]) if o >= 0 else None for o in owner]
    assert mine == [1, 1, None, 2, 3, None]


_size = st.one_of(st.integers(0, 5000), st.integers(-3, 2**45), st.floats(allow_nan=True), st.booleans(), st.none(),
                  st.text(max_size=5))
_dims = st.lists(st.one_of(st.lists(_size, max_size=5), _size, st.none()), max_size=18)
_texts = st.lists(st.one_of(st.sampled_from(["", "True", "False", "1", "0", "2", "-1", "[1, 1]", "[2]", "[True, False]",
                                             "[0, 0]", "0.", "[", "[x]", "[1e99]", "float", "c10::BFloat16"]),
                            st.text(max_size=8), st.integers(), st.none()), max_size=18)


@settings(max_examples=int(os.environ.get("TRACECLIFF_FUZZ_EXAMPLES", "0")) or 400, deadline=None)
@given(st.sampled_from(sorted(SHAPE_OP_NAMES)), _dims, _texts, _texts)
def test_any_recorded_arguments_give_a_count_or_a_reason(name, dims, types, concrete):
    """Hostile or odd recordings never raise: a finite, non-negative count (sizes up to the
    plausible bound), or unknown with the reason naming the op."""
    try:
        recorded = tuple(json.dumps(x, allow_nan=True).encode() for x in (dims, types, concrete))
    except (ValueError, OverflowError):
        return
    count = count_op.__wrapped__(name, recorded)
    if count.flops is None:
        assert count.reason and (count.reason.startswith(name) or "record_shapes" in count.reason)
    else:
        assert math.isfinite(count.flops) and 0 <= count.flops <= 2.0**62
        assert count.family in ("gemm", "attention", "conv", "other")
