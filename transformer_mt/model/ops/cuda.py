"""The backend of a GPU (``auto`` on CUDA, and on MPS): the paths a GPU ran before the CUDA work, the place it grows.

:class:`CudaOps` is :class:`~transformer_mt.model.ops.reference.ReferenceOps` with:

- SDPA held to the flash and memory-efficient kernels on CUDA (:data:`CUDA_SDPA_BACKENDS`);
- the vocabulary projection and the label-smoothed loss in row chunks, the products in the autocast dtype with
  float32 accumulation, the softmax in float32, the gradient taken in the forward
  (:mod:`~transformer_mt.model.ops.chunked_loss`); under ``train.compile`` each chunk's pass over its logits is a
  compiled kernel (:meth:`CudaOps.compiled`);
- the CPU package's device-generic paths, until this backend brings its own kernels: ScaleNorm's written-out
  backward in training, and a decoding step's attention spelled out over at least ``STEP_SPELLED_OUT_ROWS`` rows.

Every method is traceable by ``torch.compile`` (:mod:`~transformer_mt.model.ops.compiling` compiles the layers that
call them): its choices are made from what a trace sees as constants (device, dtype, grad mode, shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_mt.model.ops.chunked_loss import EAGER, ChunkPasses, chunked_projected_sums
from transformer_mt.model.ops.cpu.generic import GenericFastPaths
from transformer_mt.model.ops.cpu.scale_norm import WrittenOutScaleNorm
from transformer_mt.model.ops.varlen import flash_varlen, flash_varlen_applies

# The SDPA kernels allowed on a GPU: not cuDNN's, which torch prefers for bfloat16 / float16 on recent GPUs. cuDNN
# builds an execution plan for every new (batch, query length, key length) shape; token-bucketed batches and a
# search's growing prefix bring a new shape with nearly every batch and step, so the plans would cost more than the
# attention. Flash and memory-efficient attention need no plan. An empty list lets torch choose.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

KernelCompiler = Callable[[Callable[..., Any], str], Callable[..., Any]]  # (function, region name) -> compiled


class CudaOps(GenericFastPaths):
    """A GPU's paths (the module's docstring). ``passes``: the loss's passes over a chunk's logits (torch ops, or
    compiled: :meth:`compiled`); ``loss_chunk_rows``: rows per chunk of the loss (None: as many as
    ``chunked_loss.chunk_rows`` fits for the vocabulary)."""

    name = "cuda"

    def __init__(self, *, passes: ChunkPasses = EAGER, loss_chunk_rows: int | None = None):
        self.passes = passes
        self.loss_chunk_rows = loss_chunk_rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}(compiled loss)" if self.passes is not EAGER else super().__repr__()

    def compiled(self, compile: KernelCompiler) -> CudaOps:
        """This backend with the loss's passes compiled by ``compile`` (``Compiler.function``), one region each."""
        passes = ChunkPasses(
            sums=compile(EAGER.sums, "loss pass"), sums_and_grad=compile(EAGER.sums_and_grad, "loss pass + grad")
        )
        return type(self)(passes=passes, loss_chunk_rows=self.loss_chunk_rows)

    def scale_norm(self, x: Tensor, g: Tensor, eps: float) -> Tensor:
        if not torch.is_grad_enabled():  # inference: the formula, without an autograd Function's call cost
            return super().scale_norm(x, g, eps)
        return WrittenOutScaleNorm.apply(x, g, eps)

    def sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, dropout_p: float
    ) -> Tensor:
        if q.device.type != "cuda" or not CUDA_SDPA_BACKENDS:
            return super().sdpa(q, k, v, allowed, causal=causal, dropout_p=dropout_p)
        with sdpa_kernel(CUDA_SDPA_BACKENDS):
            return super().sdpa(q, k, v, allowed, causal=causal, dropout_p=dropout_p)

    def varlen_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_q: Tensor,
        cu_k: Tensor,
        max_q: int,
        max_k: int,
        *,
        causal: bool,
        dropout_p: float,
    ) -> Tensor:
        """Packed sentences by flash attention's varlen kernel, no compute on padding (:mod:`.varlen` says where it
        applies); the reference form (padded, through :meth:`sdpa`) elsewhere."""
        if not flash_varlen_applies(q, k, v, dropout_p=dropout_p):
            return super().varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, dropout_p=dropout_p)
        return flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)

    def projected_loss(
        self, h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, bias: Tensor | None, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        return chunked_projected_sums(
            h,
            weight,
            target,
            epsilon=epsilon,
            bias=bias,
            ignore_index=ignore_index,
            rows=self.loss_chunk_rows,
            passes=self.passes,
        )
