"""Measured FLOPs: torch's FlopCounterMode, taught the CPU kernels it has no formula for.

- The CPU flash-attention kernels SDPA uses here are counted as it counts the CUDA ones (forward Q K^T
  and A V; backward recomputes Q K^T and does 4 more matmuls).
- oneDNN's matmul (``mkldnn::_linear_pointwise``), which a float32 CPU training step runs its Linear
  layers and the fused loss's products through (``transformer_mt.model.ops.cpu``), is counted as the
  ``x @ w.T`` it computes.
- tmt's C++ attention over few keys (``tmt::short_attention``, ``transformer_mt.model.ops.cpu.native``) is counted
  as the batched matmuls it replaces: Q K^T and P V forward over every (query, key) pair (the causal
  half too, as SDPA's formula and the batched matmuls count it), four products of the same sizes backward.

The analytic count beside it is ``transformer_mt.runtime.forward_flops`` (3 x forward for a training step).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from transformer_mt.model import label_smoothed_nll_loss
from transformer_mt.model.ops.cpu import native
from transformer_mt.runtime import autocast


def cpu_formulas() -> dict:
    """FlopCounterMode formulas for the CPU flash-attention kernels (borrowed from the CUDA kernels'), oneDNN's
    matmul and tmt's C++ attention."""
    aten = torch.ops.aten

    # FlopCounterMode passes the op's other arguments and out_shape too; the count needs only the shapes of
    # q, k, v (and g).
    def fwd(q, k, v, *_args, **_kwargs) -> int:
        return sdpa_flop_count(q, k, v)

    def bwd(g, q, k, v, *_args, **_kwargs) -> int:
        return sdpa_backward_flop_count(g, q, k, v)

    def linear(x, w, *_args, **_kwargs) -> int:  # x (..., K), w (N, K): 2 x rows x K x N
        return 2 * math.prod(x) * w[0]

    def short_attention(q, k, v, *_args, **_kwargs) -> int:  # q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv)
        b, t, h, dk = q
        return 2 * b * h * t * k[1] * (dk + v[3])

    def short_attention_backward(_g, q, k, v, *_args, **_kwargs) -> int:  # dP = dO V^T, dQ, dK, dV
        return 2 * short_attention(q, k, v)

    names = {
        "_scaled_dot_product_flash_attention_for_cpu": fwd,
        "_scaled_dot_product_flash_attention_for_cpu_backward": bwd,
    }
    formulas = {getattr(aten, name): fn for name, fn in names.items() if hasattr(aten, name)}
    onednn = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    if onednn is not None:
        formulas[onednn] = linear
    if native.available():  # builds the kernels now if a step would: their ops must be known before it runs
        formulas[torch.ops.tmt.short_attention] = short_attention
        formulas[torch.ops.tmt.short_attention_backward] = short_attention_backward
    return formulas


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that FlopCounterMode sees while ``fn()`` runs."""
    with FlopCounterMode(display=False, custom_mapping=cpu_formulas()) as counter:
        fn()
    return counter.get_total_flops()


def train_step_flops(model, batch, *, dtype: str, epsilon: float) -> int:
    """Measured FLOPs of forward, label-smoothed loss and backward on one batch; gradients are dropped."""

    def step() -> None:
        with autocast(torch.device("cpu"), dtype):
            logits = model(batch.src, batch.tgt_in)
        label_smoothed_nll_loss(logits, batch.tgt_out, epsilon=epsilon)[0].backward()

    flops = count_flops(step)
    model.zero_grad(set_to_none=True)
    return flops
