"""Flash attention over packed sentences on a GPU: ``torch.nn.attention.varlen.varlen_attn``, where it applies.

The kernel takes the packed layout of :meth:`~transformer_mt.model.ops.Ops.varlen_attention` as it is (tokens, heads,
dim), with int32 cumulative lengths, and computes no padding. It runs on CUDA GPUs of compute capability 8.0 or newer
(flash attention's), in float16 or bfloat16 (under autocast the projections give those), with the same head size for
keys and values (at most 256, a multiple of 8), and without attention dropout (the kernel has none). Elsewhere the
backend computes the reference form. torch 2.10 is tmt's floor; a torch without the module has no kernel.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

varlen_attn: Callable[..., Any] | None
try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # a torch without the varlen module
    varlen_attn = None

FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MIN_CAPABILITY = (8, 0)
# Causal masking is window_size (-1, 0) in torch's current signature; the first releases took is_causal.
CAUSAL_BY_WINDOW = varlen_attn is not None and "window_size" in inspect.signature(varlen_attn).parameters


_capable: dict[int, bool] = {}  # device index -> flash_capable, asked once per device


@torch.compiler.assume_constant_result  # a property of the machine: a compiled layer keeps it as a constant
def flash_capable(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` runs flash attention (compute capability 8.0 or newer)."""
    if device_index not in _capable:
        _capable[device_index] = torch.cuda.get_device_capability(device_index) >= FLASH_MIN_CAPABILITY
    return _capable[device_index]


def flash_varlen_applies(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float) -> bool:
    """Whether :func:`flash_varlen` computes these q (Nq, H, Dk), k (Nk, H, Dk), v (Nk, H, Dv) (the module's
    docstring)."""
    head = q.size(-1)
    return (
        varlen_attn is not None
        and q.device.type == "cuda"
        and dropout_p == 0.0
        and q.dtype in FLASH_DTYPES
        and q.dtype == k.dtype == v.dtype
        and head == v.size(-1)
        and head % 8 == 0
        and head <= 256
        and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        and flash_capable(q.device.index if q.device.index is not None else torch.cuda.current_device())
    )


def flash_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, *, causal: bool
) -> Tensor:
    """``varlen_attn`` with scale 1/sqrt(Dk): q (Nq, H, Dk), k (Nk, H, Dk), v (Nk, H, Dv), ``cu_q`` / ``cu_k`` (B + 1,)
    int32 -> (Nq, H, Dv). ``causal``: each query sees its sentence's keys at or before its position (the lengths of
    both sides equal)."""
    assert varlen_attn is not None  # flash_varlen_applies said so
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)  # a no-op for the packed batch's own
    if CAUSAL_BY_WINDOW:
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0) if causal else (-1, -1))
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=causal)
