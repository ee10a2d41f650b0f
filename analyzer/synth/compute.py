"""The model's compute: aten ops and the kernels they launch, timed from FLOPs and bytes.

Kernel names follow what cuBLAS / FlashAttention / ATen print on H100 (sm90) or A100 (sm80).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from . import physics
from .engine import Engine, GpuEvent, Work
from .layout import Param, embedding_params, head_params, layer_params
from .spec import JobSpec

COMPUTE_STREAM = 7
BF16 = "c10::BFloat16"
ELEMENTWISE_ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
)
GELU_FWD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
    "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl("
    "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
    "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"
)
GELU_BWD = GELU_FWD.replace("GeluCUDAKernelImpl", "GeluBackwardCUDAKernelImpl").replace(
    "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>",
    "{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul>",
)
LN_FWD = (
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
    "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
)
LN_BWD_INPUT = (
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>("
    "c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
    "c10::BFloat16*, int)"
)
LN_BWD_GAMMA = (
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float, 32u, "
    "32u, 256u, false, true>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, "
    "float const*, c10::BFloat16*, c10::BFloat16*)"
)
BIAS_GRAD = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<"
    "float, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::"
    "{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, "
    "at::native::func_wrapper_t<float, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::"
    "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 4>)"
)
_FLASH_TRAITS = (
    "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >"
)
FLASH_FWD = (
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
    "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
)
FLASH_BWD = (
    f"void pytorch_flash::flash_bwd_dot_do_o_kernel<true, {_FLASH_TRAITS} >(pytorch_flash::Flash_bwd_params)",
    f"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<{_FLASH_TRAITS}, true, false, false, "
    "false, false, true, false, false>(pytorch_flash::Flash_bwd_params)",
    f"void pytorch_flash::flash_bwd_convert_dq_kernel<{_FLASH_TRAITS} >(pytorch_flash::Flash_bwd_params, int)",
)
EMBED_FWD = (
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
    "true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 "
    "const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, "
    "unsigned int, long)"
)
EMBED_BWD = (
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>("
    "long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)"
)
LOG_SOFTMAX_FWD = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, c10::BFloat16 const*, int)"
)
LOG_SOFTMAX_BWD = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<8, c10::BFloat16, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(c10::BFloat16*, float const*, float const*, long)"
)
NLL_FWD = (
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
    "float*, float const*, long const*, float const*, bool, long, long, long, long)"
)
NLL_BWD = (
    "void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, "
    "float const*, long const*, float const*, float const*, bool, int, int, long, long)"
)
FUSED_ADAMW = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
    "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*>("
    "at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, "
    "double, bool, double*, double*)"
)

def _nothing(thread: str) -> None:
    pass


GradHook = Callable[[list[Param], str], None]
SublayerHook = Callable[[str], None]  # called on a thread after a block's attention or MLP part


def gemm_name(arch: str, layout: str, tile: str, dtype: str = "bf16") -> str:
    types = "bf16bf16_bf16f32_f32" if dtype == "bf16" else "f32f32_f32f32_f32"
    return (
        f"{arch}_xmma_gemm_{types}_{layout}_n_tilesize{tile}_warpgroupsize2x1x1_"
        "execute_segment_k_off_kernel__5x_cublas"
    )


TORCH_TYPE = {"bf16": BF16, "fp32": "float"}
ATTENTION_FWD_FACTOR = 0.5  # causal: half of the 4·b·h·s²·d of full attention (models.md §6)
ATTENTION_BWD_FACTOR = 2.5  # the convention the counts follow: backward = 2.5 × forward


class Compute:
    """Emits the model's ops (CPU ranges + kernels) onto an Engine."""

    def __init__(self, eng: Engine, spec: JobSpec):
        self.eng, self.spec = eng, spec
        self.slowdown = np.ones(spec.world_size)
        if spec.straggler_rank is not None:
            self.slowdown[spec.straggler_rank] = spec.straggler_slowdown
        arch = spec.gpu_model.arch
        dtype = spec.gemm_dtype
        self.gemm = {
            "fwd": gemm_name(arch, "tn", "128x256x64", dtype),
            "dgrad": gemm_name(arch, "nn", "128x256x64", dtype),
            "wgrad": gemm_name(arch, "nt", "256x128x64", dtype),
        }
        self.flops = 0.0  # matmul + attention FLOPs issued per rank so far (models.md §6's convention)

    # ---- primitives -------------------------------------------------------------------------
    def kernel(self, name: str, us: float, thread: str, grid, block, regs: int = 128, smem: int = 0) -> GpuEvent:
        dur = self.eng.jitter_ns(max(us, 1.5) * self.slowdown)
        args = {"grid": list(grid), "block": list(block), "registers per thread": regs, "shared memory": smem}
        return self.eng.launch(name, COMPUTE_STREAM, dur, thread, args=args)

    def elementwise(self, name: str, nbytes: float, thread: str) -> GpuEvent:
        blocks = int(min(2**31 - 1, max(1, nbytes // 2048)))
        return self.kernel(name, physics.memory_us(self.spec, nbytes), thread, (blocks, 1, 1), (128, 1, 1), 24)

    @contextmanager
    def work(self, op: str, family: str, dtype: str, flops: float, shape: tuple) -> Iterator[None]:
        """The kernels launched inside do ``flops`` of ``op`` (the truth's count, GpuEvent.work)."""
        self.flops += flops
        self.eng.work = Work(op, family, dtype, flops, shape)
        try:
            yield
        finally:
            self.eng.work = None

    def matmul(self, m: int, k: int, n: int, thread: str, which: str, op: str) -> GpuEvent:
        """An m×k by k×n product issued by leaf op ``op``: 2·m·k·n FLOPs."""
        flops = 2.0 * m * k * n
        grid = (max(1, n // 256), max(1, m // 128), 1)
        with self.work(op, "gemm", self.spec.gemm_dtype, flops, (m, n, k)):
            return self.kernel(self.gemm[which], physics.gemm_us(self.spec, flops, (m, n, k)), thread, grid,
                               (384, 1, 1), 168, 213_000)

    def _dims(self, *dims) -> dict:
        if not self.spec.record_shapes:
            return {}
        return {"Input Dims": [list(d) for d in dims], "Input type": [self._dtype_of(d) for d in dims]}

    def _recorded(self, dims: list, types: list, concrete: list) -> dict:
        """The args record_shapes writes (torch 2.13): sizes, types ("Scalar" for scalars, ""
        for an absent optional tensor) and the scalars' values as text."""
        if not self.spec.record_shapes:
            return {}
        return {"Input Dims": [list(d) for d in dims], "Input type": list(types), "Concrete Inputs": list(concrete)}

    @staticmethod
    def _dtype_of(dims) -> str:
        return "c10::BFloat16" if dims else ""

    # ---- forward ops ------------------------------------------------------------------------
    def linear(self, d_in: int, d_out: int, thread: str = "main") -> None:
        """``aten::linear(x [b, s, d_in], weight [d_out, d_in], bias)`` over ``aten::addmm(bias,
        x [t, d_in], weightᵀ [d_in, d_out], beta, alpha)`` (``aten::mm`` without bias)."""
        t, s = self.spec.tokens_per_rank, self.spec
        dt = TORCH_TYPE[s.gemm_dtype]
        linear = self._recorded([(s.micro_batch, s.seq_len, d_in), (d_out, d_in), (d_out,) if s.bias else ()],
                                [dt, dt, dt if s.bias else ""], ["", "", ""])
        if s.bias:
            op, args = "aten::addmm", self._recorded([(d_out,), (t, d_in), (d_in, d_out), (), ()],
                                                     [dt, dt, dt, "Scalar", "Scalar"], ["", "", "", "1", "1"])
        else:
            op, args = "aten::mm", self._recorded([(t, d_in), (d_in, d_out)], [dt, dt], ["", ""])
        with self.eng.op("aten::linear", thread, args=linear):
            with self.eng.op(op, thread, args=args):
                self.matmul(t, d_in, d_out, thread, "fwd", op)

    def layer_norm(self, thread: str = "main") -> None:
        s, t, d = self.spec, self.spec.tokens_per_rank, self.spec.hidden
        with self.eng.op("aten::layer_norm", thread, args=self._dims((s.micro_batch, s.seq_len, d), (d,))):
            with self.eng.op("aten::native_layer_norm", thread):
                self.elementwise(LN_FWD, 4.0 * t * d, thread)

    def attention(self, thread: str = "main") -> None:
        """Causal SDPA as torch 2.13 records it: ``scaled_dot_product_attention`` ->
        ``_scaled_dot_product_flash_attention`` ([b, h, s, d]) -> ``_flash_attention_forward``
        ([b, s, h, d], the kernel's layout), each with its arguments."""
        s = self.spec
        heads = s.hidden // s.head_dim
        flops = 2.0 * s.micro_batch * s.seq_len**2 * s.hidden  # causal: half of 4·b·s²·d (kernel time)
        q, qs = (s.micro_batch, heads, s.seq_len, s.head_dim), (s.micro_batch, s.seq_len, heads, s.head_dim)
        seq = str(s.seq_len)
        sdpa = self._recorded([q, q, q, (), (), (), (), ()], [BF16] * 3 + ["", "Scalar", "Scalar", "", "Scalar"],
                              ["", "", "", "", "0.", "True", "", "False"])
        flash = self._recorded([q, q, q, (), (), (), ()], [BF16] * 3 + ["Scalar", "Scalar", "Scalar", ""],
                               ["", "", "", "0.", "True", "False", ""])
        kernel = self._recorded([qs, qs, qs] + [()] * 14, [BF16] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar",
                                                                         "Scalar"] + [""] * 7,
                                ["", "", "", "", "", seq, seq, "0.", "True", "False"] + [""] * 7)
        count = ATTENTION_FWD_FACTOR * 4.0 * s.micro_batch * heads * s.seq_len**2 * s.head_dim
        with self.eng.op("aten::scaled_dot_product_attention", thread, args=sdpa):
            with self.eng.op("aten::_scaled_dot_product_flash_attention", thread, args=flash):
                with self.eng.op("aten::_flash_attention_forward", thread, args=kernel):
                    with self.work("aten::_flash_attention_forward", "attention", "bf16", count,
                                   (s.micro_batch, heads, s.seq_len, s.head_dim, False)):
                        grid = (max(1, s.seq_len // 128), heads, s.micro_batch)
                        self.kernel(FLASH_FWD, physics.attention_us(s, flops), thread, grid, (128, 1, 1), 255,
                                    98_304)

    def simple(self, op: str, kernel: str, nbytes: float, thread: str = "main") -> None:
        with self.eng.op(op, thread):
            self.elementwise(kernel, nbytes, thread)

    def layer_forward(self, after_sublayer: SublayerHook = _nothing, thread: str = "main") -> None:
        s = self.spec
        t, d, f = s.tokens_per_rank, s.hidden, s.ffn
        self.layer_norm(thread)
        self.linear(d, 3 * d, thread)
        self.attention(thread)
        self.linear(d, d, thread)
        after_sublayer(thread)
        self.simple("aten::add", ELEMENTWISE_ADD, 6.0 * t * d, thread)
        self.layer_norm(thread)
        self.linear(d, f, thread)
        self.simple("aten::gelu", GELU_FWD, 4.0 * t * f, thread)
        self.linear(f, d, thread)
        after_sublayer(thread)
        self.simple("aten::add", ELEMENTWISE_ADD, 6.0 * t * d, thread)

    def embed_forward(self) -> None:
        s = self.spec
        with self.eng.op("aten::embedding", args=self._dims((s.vocab_size, s.hidden), (s.micro_batch, s.seq_len))):
            with self.eng.op("aten::index_select"):
                self.elementwise(EMBED_FWD, 2.0 * s.tokens_per_rank * s.hidden, "main")

    def head_forward(self) -> None:
        self.layer_norm()
        self.linear(self.spec.hidden, self.spec.vocab_size)

    def loss_forward(self) -> None:
        s = self.spec
        logits = 2.0 * s.tokens_per_rank * s.vocab_size
        dims = self._dims((s.tokens_per_rank, s.vocab_size), (s.tokens_per_rank,))
        with self.eng.op("aten::cross_entropy_loss", args=dims):
            self.simple("aten::log_softmax", LOG_SOFTMAX_FWD, 3.0 * logits)
            self.simple("aten::nll_loss_nd", NLL_FWD, logits)

    # ---- backward ops (autograd thread) ----------------------------------------------------
    def node(self, name: str):
        return self.eng.op(f"autograd::engine::evaluate_function: {name}", "autograd")

    def linear_backward(self, d_in: int, d_out: int, params: list[Param], on_grads: GradHook) -> None:
        s, t, a = self.spec, self.spec.tokens_per_rank, "autograd"
        name = "AddmmBackward0" if s.bias else "MmBackward0"
        dt = TORCH_TYPE[s.gemm_dtype]
        with self.node(name):
            with self.eng.op(name, a):
                with self.eng.op("aten::mm", a, args=self._recorded([(t, d_out), (d_out, d_in)], [dt, dt], ["", ""])):
                    self.matmul(t, d_out, d_in, a, "dgrad", "aten::mm")
                with self.eng.op("aten::mm", a, args=self._recorded([(d_out, t), (t, d_in)], [dt, dt], ["", ""])):
                    self.matmul(d_out, t, d_in, a, "wgrad", "aten::mm")
                if s.bias:
                    self.simple("aten::sum", BIAS_GRAD, 2.0 * t * d_out, a)
        on_grads(params, a)

    def layer_norm_backward(self, params: list[Param], on_grads: GradHook) -> None:
        t, d, a = self.spec.tokens_per_rank, self.spec.hidden, "autograd"
        with self.node("NativeLayerNormBackward0"):
            with self.eng.op("NativeLayerNormBackward0", a):
                with self.eng.op("aten::native_layer_norm_backward", a):
                    self.elementwise(LN_BWD_INPUT, 6.0 * t * d, a)
                    self.elementwise(LN_BWD_GAMMA, 2.0 * t * d, a)
        on_grads(params, a)

    def attention_backward(self) -> None:
        """``_scaled_dot_product_flash_attention_backward(grad_out, q, k, v, out, logsumexp, ...,
        is_causal, ...)`` -> ``_flash_attention_backward`` ([b, s, h, d]); its three kernels are
        the op's GPU time."""
        s, a = self.spec, "autograd"
        heads = s.hidden // s.head_dim
        flops = 2.0 * 2.0 * s.micro_batch * s.seq_len**2 * s.hidden  # the kernel's time (unchanged)
        grid = (max(1, s.seq_len // 128), heads, s.micro_batch)
        q, qs = (s.micro_batch, heads, s.seq_len, s.head_dim), (s.micro_batch, s.seq_len, heads, s.head_dim)
        lse, seq = (s.micro_batch, heads, s.seq_len), str(s.seq_len)
        scalars = ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "", "", "Scalar"]
        sdpa = self._recorded([q] * 5 + [lse] + [()] * 9, [BF16] * 5 + ["float"] + scalars,
                              [""] * 8 + [seq, seq, "0.", "True", "", "", ""])
        kernel = self._recorded([qs] * 5 + [lse] + [()] * 11, [BF16] * 5 + ["float"] + scalars + ["Scalar"] * 2,
                                [""] * 8 + [seq, seq, "0.", "True", "", "", "", "", ""])
        count = ATTENTION_BWD_FACTOR * ATTENTION_FWD_FACTOR * 4.0 * s.micro_batch * heads * s.seq_len**2 * s.head_dim
        with self.node("ScaledDotProductFlashAttentionBackward0"):
            with self.eng.op("aten::_scaled_dot_product_flash_attention_backward", a, args=sdpa):
                with self.eng.op("aten::_flash_attention_backward", a, args=kernel):
                    with self.work("aten::_flash_attention_backward", "attention", "bf16", count,
                                   (s.micro_batch, heads, s.seq_len, s.head_dim, True)):
                        self.elementwise(FLASH_BWD[0], 4.0 * s.tokens_per_rank * s.hidden, a)
                        self.kernel(FLASH_BWD[1], physics.attention_us(s, flops), a, grid, (256, 1, 1), 255, 147_456)
                        self.elementwise(FLASH_BWD[2], 6.0 * s.tokens_per_rank * s.hidden, a)

    def elementwise_backward(self, node: str, kernel: str | None, nbytes: float) -> None:
        with self.node(node):
            if kernel:
                with self.eng.op(node, "autograd"):
                    self.elementwise(kernel, nbytes, "autograd")

    def layer_backward(self, i: int, on_grads: GradHook, after_sublayer: SublayerHook = _nothing) -> None:
        s = self.spec
        t, d, f = s.tokens_per_rank, s.hidden, s.ffn
        by = _by_module(layer_params(s, i))
        if s.activation_checkpointing:  # reentrant torch.utils.checkpoint: the layer's forward again
            with self.node("CheckpointFunctionBackward"):
                self.layer_forward(thread="autograd")
        self.elementwise_backward("AddBackward0", None, 0)
        self.linear_backward(f, d, by["mlp.fc2"], on_grads)
        self.elementwise_backward("GeluBackward0", GELU_BWD, 6.0 * t * f)
        self.linear_backward(d, f, by["mlp.fc1"], on_grads)
        after_sublayer("autograd")
        self.layer_norm_backward(by["norm2"], on_grads)
        self.elementwise_backward("AddBackward0", None, 0)
        self.linear_backward(d, d, by["attn.out"], on_grads)
        self.attention_backward()
        self.linear_backward(d, 3 * d, by["attn.qkv"], on_grads)
        after_sublayer("autograd")
        self.layer_norm_backward(by["norm1"], on_grads)

    def loss_backward(self) -> None:
        logits = 2.0 * self.spec.tokens_per_rank * self.spec.vocab_size
        self.elementwise_backward("NllLossBackward0", NLL_BWD, logits)
        self.elementwise_backward("LogSoftmaxBackward0", LOG_SOFTMAX_BWD, 3.0 * logits)

    def head_backward(self, on_grads: GradHook) -> None:
        params = head_params(self.spec)
        self.linear_backward(self.spec.hidden, self.spec.vocab_size, params[-1:], on_grads)
        self.layer_norm_backward(params[:-1], on_grads)

    def embed_backward(self, on_grads: GradHook) -> None:
        s, a = self.spec, "autograd"
        weight_bytes = 2.0 * s.vocab_size * s.hidden
        with self.node("EmbeddingBackward0"):
            with self.eng.op("aten::embedding_dense_backward", a):
                with self.eng.op("aten::zero_", a):
                    dur = self.eng.jitter_ns(physics.memory_us(s, weight_bytes) * self.slowdown)
                    self.eng.launch("Memset (Device)", COMPUTE_STREAM, dur, a, kind="memory", cat="gpu_memset",
                                    args={"bytes": int(weight_bytes)})
                self.elementwise(EMBED_BWD, 4.0 * s.tokens_per_rank * s.hidden, a)
        on_grads(embedding_params(s), a)

    # ---- optimizer and step edges ---------------------------------------------------------
    def optimizer_step(self, local_params: float) -> list[GpuEvent]:
        """Fused AdamW over this rank's parameters, in 4 multi-tensor chunks (memory-bound)."""
        nbytes = local_params * self.spec.optimizer_bytes_per_param
        with self.eng.op("aten::_fused_adamw_"):
            return [self.elementwise(FUSED_ADAMW, nbytes / 4, "main") for _ in range(4)]

    def copy_inputs(self) -> None:
        nbytes = 2 * 8 * self.spec.tokens_per_rank  # int64 input ids and labels
        with self.eng.op("aten::to"), self.eng.op("aten::_to_copy"), self.eng.op("aten::copy_"):
            dur = self.eng.jitter_ns(2.0 + nbytes / 20e3)  # PCIe ~20 GB/s
            self.eng.launch("Memcpy HtoD (Pinned -> Device)", COMPUTE_STREAM, dur, kind="memory", cat="gpu_memcpy",
                            args={"bytes": nbytes})

    def loss_item(self) -> None:
        """loss.item(): a 4-byte device-to-host copy, then the CPU waits for the stream; or, with
        loss_copy "pageable", loss.cpu(): the copy's own call blocks until it is done."""
        if self.spec.loss_copy == "pageable":
            with self.eng.op("aten::to"), self.eng.op("aten::_to_copy"), self.eng.op("aten::copy_"):
                self.eng.copy_to_pageable("Memcpy DtoH (Device -> Pageable)", COMPUTE_STREAM, 4, self.spec.pcie_gbps,
                                          "main")
            return
        with self.eng.op("aten::item"), self.eng.op("aten::_local_scalar_dense"):
            dur = self.eng.jitter_ns(np.full(self.spec.world_size, 1.5))
            self.eng.launch("Memcpy DtoH (Device -> Pageable)", COMPUTE_STREAM, dur, kind="memory",
                            cat="gpu_memcpy", args={"bytes": 4})
            self.eng.synchronize(COMPUTE_STREAM)


def _by_module(params: list[Param]) -> dict[str, list[Param]]:
    out: dict[str, list[Param]] = {}
    for p in params:
        module = p.name.split(".", 2)[2].rsplit(".", 1)[0]
        out.setdefault(module, []).append(p)
    return out
