"""The CPU backend's attention: the C++ kernel's autograd forms for a training step over few keys, and a decoding
step's attention spelled out for the cache's layout.

- :func:`short_attention`: ``torch.ops.tmt.short_attention`` (``csrc/short_attention.cpp``, built by
  :mod:`~transformer_mt.model.ops.cpu.native`) and its backward, each (sentence, head) in one pass from the scores to
  the output. Where q, k and v are the heads of fused projections, the gradient goes to the projections whole.
- :func:`step_self_attention` and :func:`step_cross_attention`: a decoding step over many rows
  (:data:`STEP_SPELLED_OUT_ROWS`) as element-wise products and batched matmuls, instead of SDPA.

Shapes: B batch, T queries, K keys, H heads, Dk / Dv key / value size per head, R rows, G groups of rows.
Masks: True = attend.
"""

from __future__ import annotations

import torch
from torch import Tensor

# SDPA's CPU flash kernel works in blocks sized for long sequences; below this many keys, the product spelled out
# as two batched matmuls and a softmax is faster forward and backward (docs/benchmarks.md, the attention row).
SHORT_KEYS = 64

# A decoding step over at least this many rows spells its attention out: SDPA's CPU flash kernel works in blocks
# sized for long sequences, and one query per row over a few dozen keys leaves them nearly empty. Fewer rows (one
# sentence) keep SDPA, whose single call costs less than the spelled-out ops' dispatch.
STEP_SPELLED_OUT_ROWS = 32


def step_self_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None) -> Tensor:
    """Self-attention of a decoding step, softmax(q k^T / sqrt(Dk)) v, over the cache's buffers as they are: q (R, H,
    1, Dk), k (R, H, T, Dk), v (R, H, T, Dv) (views of the growing cache's (T, R, H, D) buffers, or a static cache's
    (R, H, T, D)) -> (R, 1, H*Dv). ``allowed`` None: every cached position is in the query's past, no mask; else
    (1 or R, 1, 1, T) True = attend (a static cache's filled prefix)."""
    keys, values = k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)  # (R, H, T, D) -> (T, R, H, D), contiguous
    scores = (keys * (q[:, :, 0] * q.size(-1) ** -0.5)).sum(-1)  # (T, R, H); section 3.2.1 scaling
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, :, 0].permute(2, 0, 1), float("-inf"))  # (1|R, 1, T) -> (T, 1|R, 1)
    out = (scores.softmax(dim=0).unsqueeze(-1) * values).sum(0)  # (T, R, H, 1) * (T, R, H, Dv) -> (R, H, Dv)
    return out.reshape(out.size(0), 1, -1)  # (R, H, Dv) -> (R, 1, H*Dv)


def step_cross_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """Cross-attention of a decoding step as two batched matmuls and a softmax: q (G, H, group, Dk) (a sentence's
    beams as its query positions), k (G, H, S, Dk), v (G, H, S, Dv), ``allowed`` (G, 1, 1, S) True = attend, or None
    -> (G, group, H*Dv)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5  # (G, H, group, S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # allowed_mask leaves every row a key: no NaN
    out = torch.matmul(scores.softmax(dim=-1), v)  # (G, H, group, Dv)
    return out.transpose(1, 2).reshape(q.size(0), q.size(2), -1)  # (G, group, H, Dv) -> (G, group, H*Dv)


def kernel_takes(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> bool:
    """Whether :func:`short_attention` computes this attention (q (B, H, T, Dk), k, v (B, H, K, D)): float32, head
    sizes multiples of 16, a key-padding mask (B, 1, 1, K) or none. The caller checks the key count and the build."""
    return (
        q.dtype == k.dtype == v.dtype == torch.float32
        and q.size(-1) % 16 == 0
        and v.size(-1) % 16 == 0
        and (allowed is None or (allowed.dim() == 4 and allowed.size(1) == 1 and allowed.size(2) == 1))
    )


class _ShortAttention(torch.autograd.Function):
    """softmax(scale * q k^T, masked) v over heads, as (B, T, H * Dv); gradients for q, k and v."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, causal: bool, scale: float
    ) -> Tensor:  # autograd's signature: ctx untyped
        out, probs = torch.ops.tmt.short_attention(q, k, v, allowed, causal, scale)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        q, k, v, probs = ctx.saved_tensors
        gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.tmt.short_attention_backward(grad, q, k, v, probs, ctx.scale, gq, gk, gv)
        return gq, gk, gv, None, None, None


Geometry = tuple[tuple[int, ...], tuple[int, ...], int]  # a view's size, stride and offset in its base


class _ShortAttentionOnProjections(torch.autograd.Function):
    """:class:`_ShortAttention` taking the projections q, k and v are views of, (B, T, W) each: self-attention's one
    fused (q, k, v) matrix (``kv_base`` None), or cross-attention's queries and fused (k, v). Their gradients are
    written into one buffer per projection, in the views' places, instead of three tensors that the views' backward
    (a split's) would copy together."""

    @staticmethod
    def forward(
        ctx,
        q_base: Tensor,
        kv_base: Tensor | None,
        geometry: tuple[Geometry, Geometry, Geometry],
        allowed: Tensor | None,
        causal: bool,
        scale: float,
    ) -> Tensor:  # autograd's signature: ctx untyped
        kv = q_base if kv_base is None else kv_base
        q, k, v = (_view(base, geom) for base, geom in zip((q_base, kv, kv), geometry))
        out, probs = torch.ops.tmt.short_attention(q, k, v, allowed, causal, scale)
        ctx.save_for_backward(q_base, kv_base, probs)
        ctx.geometry, ctx.scale = geometry, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        q_base, kv_base, probs = ctx.saved_tensors
        kv = q_base if kv_base is None else kv_base
        grad_q = torch.empty_like(q_base)
        grad_kv = grad_q if kv_base is None else torch.empty_like(kv_base)
        views = [
            (_view(base, geom), _view(g, geom))
            for base, g, geom in zip((q_base, kv, kv), (grad_q, grad_kv, grad_kv), ctx.geometry)
        ]
        (q, gq), (k, gk), (v, gv) = views
        torch.ops.tmt.short_attention_backward(grad, q, k, v, probs, ctx.scale, gq, gk, gv)
        return grad_q, None if kv_base is None else grad_kv, None, None, None, None


def _geometry(view: Tensor, base: Tensor) -> Geometry:
    return tuple(view.shape), view.stride(), int(view.storage_offset() - base.storage_offset())


def _view(base: Tensor, geometry: Geometry) -> Tensor:
    """The view of ``base`` that ``geometry`` describes (its offset is from the base's own start)."""
    size, stride, offset = geometry
    return base.as_strided(size, stride, base.storage_offset() + offset)


def _tiled(base: Tensor | None, *views: Tensor) -> bool:
    """Whether ``views`` (B, T, H, d) of a contiguous ``base`` with rows of W (a (B * T, W) or (B, T, W) projection
    output) lie side by side and cover each of its rows, as the heads of a fused projection's parts do."""
    if base is None or not base.is_contiguous() or any(v._base is not base for v in views):
        return False
    if any(v.requires_grad and not base.requires_grad for v in views):  # a base outside the graph would cut it here
        return False
    row = base.size(-1)
    for v in views:
        b, t, _, d = v.shape
        if v.stride() != (t * row, row, d, 1) or b * t * row != base.numel():
            return False
    spans = sorted((v.storage_offset() - base.storage_offset(), v.size(2) * v.size(3)) for v in views)
    return (
        spans[0][0] == 0
        and all(a + n == c for (a, n), (c, _) in zip(spans, spans[1:]))
        and spans[-1][0] + spans[-1][1] == row
    )


def short_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, scale: float) -> Tensor:
    """q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv), float32 on CPU, each with a contiguous last dimension;
    ``allowed`` (B, K) bool, True = attend, or None; ``causal``: query t sees keys 0..t -> (B, T, H * Dv).

    Where q, k and v are the heads of fused projections (self-attention's (q, k, v), cross-attention's q and (k, v)),
    the gradient goes to the projections whole. Needs :func:`available`; head sizes multiples of 16, 1 to 64 keys (the
    kernel checks and raises otherwise)."""
    qb, kb = q._base, k._base
    if qb is not None and qb is kb and _tiled(qb, q, k, v):  # self-attention
        return _ShortAttentionOnProjections.apply(
            qb, None, (_geometry(q, qb), _geometry(k, qb), _geometry(v, qb)), allowed, causal, scale
        )
    if qb is not None and kb is not None and qb is not kb and _tiled(qb, q) and _tiled(kb, k, v):  # cross-attention
        return _ShortAttentionOnProjections.apply(
            qb, kb, (_geometry(q, qb), _geometry(k, kb), _geometry(v, kb)), allowed, causal, scale
        )
    return _ShortAttention.apply(q, k, v, allowed, causal, scale)
