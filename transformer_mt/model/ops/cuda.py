"""The backend of a GPU (``auto`` on CUDA, and on MPS): the paths a GPU ran before the CUDA work, the place it grows.

:class:`CudaOps` is :class:`~transformer_mt.model.ops.reference.ReferenceOps` with:

- SDPA held to the flash and memory-efficient kernels on CUDA (:data:`CUDA_SDPA_BACKENDS`);
- the CPU package's device-generic paths, until this backend brings its own kernels: ScaleNorm's written-out
  backward in training, the vocabulary projection fused with the loss in row chunks (1 GiB of logits a chunk), and
  a decoding step's attention spelled out over at least ``STEP_SPELLED_OUT_ROWS`` rows.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_mt.model.ops.cpu.generic import GenericFastPaths
from transformer_mt.model.ops.cpu.scale_norm import WrittenOutScaleNorm

# The SDPA kernels allowed on a GPU: not cuDNN's, which torch prefers for bfloat16 / float16 on recent GPUs. cuDNN
# builds an execution plan for every new (batch, query length, key length) shape; token-bucketed batches and a
# search's growing prefix bring a new shape with nearly every batch and step, so the plans would cost more than the
# attention. Flash and memory-efficient attention need no plan. An empty list lets torch choose.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class CudaOps(GenericFastPaths):
    """A GPU's paths (the module's docstring)."""

    name = "cuda"

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
