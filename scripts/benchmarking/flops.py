"""Measured FLOPs: torch's FlopCounterMode, taught the CPU flash-attention kernels.

torch has no formula for the CPU flash-attention kernels SDPA uses here, so they are counted as it
counts the CUDA ones (forward Q K^T and A V; backward recomputes Q K^T and does 4 more matmuls). The
analytic count beside it is ``transformer_mt.runtime.forward_flops`` (3 x forward for a training step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from transformer_mt.model import label_smoothed_nll_loss
from transformer_mt.runtime import autocast


def cpu_sdpa_formulas() -> dict:
    """FlopCounterMode formulas for the CPU flash-attention kernels, borrowed from the CUDA kernels'."""
    aten = torch.ops.aten

    # FlopCounterMode passes the op's other arguments and out_shape too; the count needs only the shapes of q, k, v (and g).
    def fwd(q, k, v, *_args, **_kwargs) -> int:
        return sdpa_flop_count(q, k, v)

    def bwd(g, q, k, v, *_args, **_kwargs) -> int:
        return sdpa_backward_flop_count(g, q, k, v)

    names = {"_scaled_dot_product_flash_attention_for_cpu": fwd, "_scaled_dot_product_flash_attention_for_cpu_backward": bwd}
    return {getattr(aten, name): fn for name, fn in names.items() if hasattr(aten, name)}


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that FlopCounterMode sees while ``fn()`` runs."""
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa_formulas()) as counter:
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
