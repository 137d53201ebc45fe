"""The cuda backend's loss: the vocabulary projection and the label-smoothed loss in row chunks, the products in the
compute dtype (bfloat16 under autocast) with float32 accumulation, the softmax and every sum in float32, and in
training the gradient taken in the forward. No (N, V) tensor ever exists, and nothing of a chunk outlives it.

A chunk of n rows of h (N, D): its logits x = h_c W^T (n, V), in the compute dtype. One pass over them gives each
row's log-sum-exp, target logit and logit sum, from which the loss follows (:func:`_row_losses`); in training the
same pass also gives the gradient of the loss with respect to the logits, in float32 then rounded to the compute
dtype, g = softmax(x) - eps_i - (1 - eps - eps_i) onehot(target) per counted row (the smoothed distribution puts
1 - eps on the target and eps_i = eps / (V - 1) on each other token, and the two sum to 1, hence this form), which
goes straight back through both products: dh_c = g W and dW += g^T h_c, accumulated in float32 over the chunks.

Why the gradient in the forward: the loss is a sum, so its gradient is the upstream gradient (one number) times
the gradient of the sum, which needs nothing from the backward. That makes three products per chunk, where keeping
each chunk's softmax for the backward also makes three but holds (N, V) floats, and recomputing the logits in the
backward makes four. The backward (:meth:`_LossAndGradient.backward`) only scales the two gradients.

The pass over a chunk's logits is a function of its own (:func:`row_sums`, :func:`row_sums_and_grad`), which the
cuda backend hands to ``torch.compile`` when the run compiles (:mod:`~transformer_mt.model.ops.compiling`): one
fused kernel reading the logits once and writing g once; the products stay cuBLAS's. Uncompiled, the same functions
run as torch ops. Chunks have a fixed number of rows, so a compiled pass sees two shapes per batch: full chunks,
and the last, dynamic after its second size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# Elements of a chunk's (n, V) logits: 2**27 is 256 MiB in bfloat16 (and 512 MiB for each float32 temporary of an
# uncompiled pass); a 37k vocabulary gives ~3.6k rows, so a 25k-token batch makes 7 chunks.
CHUNK_ELEMENTS = 2**27
ROW_MULTIPLE = 64  # chunk rows a multiple of this (past one multiple): whole tiles for the products


def chunk_rows(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per chunk for a vocabulary of ``vocab``: as many as fit ``elements``, rounded down to ROW_MULTIPLE."""
    rows = max(1, elements // max(vocab, 1))
    return rows - rows % ROW_MULTIPLE if rows > ROW_MULTIPLE else rows


def row_sums(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A chunk's logits (n, V) and targets (n,) -> each row's log-sum-exp, target logit and logit sum (n,), float32."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=1)
    return lse, x.gather(1, target[:, None]).squeeze(1), x.sum(1)


def row_sums_and_grad(
    logits: Tensor, target: Tensor, row_weight: Tensor, eps_i: float, on_target: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`row_sums`, and the gradient of the rows' loss with respect to the logits (n, V) in the logits' dtype:
    ``row_weight * (softmax - eps_i + on_target * onehot(target))``, row_weight (n,) float32 (0 on rows that count for
    nothing), on_target = -(1 - eps - eps_i)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=1, keepdim=True)  # (n, 1)
    hit = torch.arange(x.size(1), device=x.device)[None, :] == target[:, None]  # (n, V): a compare, fused when compiled
    g = (torch.exp(x - lse) - eps_i + torch.where(hit, on_target, 0.0)) * row_weight[:, None]
    return lse.squeeze(1), x.gather(1, target[:, None]).squeeze(1), x.sum(1), g.to(logits.dtype)


@dataclass(frozen=True)
class ChunkPasses:
    """The two passes over a chunk's logits, as torch ops or compiled (the cuda backend's ``compile``)."""

    sums: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] = row_sums
    sums_and_grad: Callable[[Tensor, Tensor, Tensor, float, float], tuple[Tensor, Tensor, Tensor, Tensor]] = (
        row_sums_and_grad
    )


EAGER = ChunkPasses()


def _row_losses(
    lse: Tensor, tgt: Tensor, total: Tensor, pad: Tensor, *, vocab: int, epsilon: float
) -> tuple[Tensor, Tensor]:
    """Each row's (N,) label-smoothed loss and NLL from its log-sum-exp, target logit and logit sum, 0 on ``pad``."""
    nll = (lse - tgt).masked_fill(pad, 0.0)
    if epsilon == 0:
        return nll, nll
    eps_i = epsilon / (vocab - 1)
    smooth = (vocab * lse - total).masked_fill(pad, 0.0)  # sum over v of -log p(v)
    return (1.0 - epsilon - eps_i) * nll + eps_i * smooth, nll


class _LossAndGradient(torch.autograd.Function):
    """The summed loss and NLL of ``h @ weight.T``, the loss's gradients taken in the forward (module docstring)."""

    @staticmethod
    def forward(  # autograd's signature: ctx untyped
        ctx,
        h: Tensor,
        weight: Tensor,
        target: Tensor,
        epsilon: float,
        ignore_index: int,
        compute_dtype: torch.dtype,
        rows: int,
        passes: ChunkPasses,
    ):
        vocab = weight.size(0)
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        pad = target == ignore_index
        safe = target.masked_fill(pad, 0)
        row_weight = (~pad).to(torch.float32)  # rows that count for nothing get no gradient either
        w = weight.to(compute_dtype)  # (V, D), cast once
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        parts = []
        for start in range(0, h.size(0), rows):
            sl = slice(start, start + rows)
            hc = h[sl].to(compute_dtype)
            logits = hc @ w.t()  # (n, D) @ (D, V) -> (n, V)
            lse, tgt, total, g = passes.sums_and_grad(logits, safe[sl], row_weight[sl], eps_i, -(1.0 - epsilon - eps_i))
            parts.append((lse, tgt, total))
            if grad_h is not None:
                grad_h[sl] = g @ w  # (n, V) @ (V, D) -> (n, D)
            if grad_w is not None:
                grad_w += _times_float32(g.t(), hc)  # (V, n) @ (n, D) -> (V, D), accumulated in float32
        loss, nll = _summed(parts, pad, vocab=vocab, epsilon=epsilon, like=h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: ARG004 - grad_nll: nll is not differentiable
        grad_h, grad_w = ctx.saved_tensors
        dh = None if grad_h is None else grad_h * grad_loss.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * grad_loss).to(ctx.weight_dtype)
        return dh, dw, None, None, None, None, None, None


def _times_float32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` with float32 accumulation and a float32 result: a low-precision product on CUDA writes float32
    (``out_dtype``), elsewhere it is rounded to its dtype and then widened."""
    if a.dtype != torch.float32 and a.device.type == "cuda":
        return torch.mm(a, b, out_dtype=torch.float32)
    return (a @ b).float()


def _summed(
    parts: list[tuple[Tensor, Tensor, Tensor]], pad: Tensor, *, vocab: int, epsilon: float, like: Tensor
) -> tuple[Tensor, Tensor]:
    """The chunks' row sums -> (loss_sum, nll_sum), float32 scalars (zeros without rows)."""
    if not parts:
        zero = like.new_zeros((), dtype=torch.float32)
        return zero, zero.clone()
    lse, tgt, total = (torch.cat(column) for column in zip(*parts))
    loss, nll = _row_losses(lse, tgt, total, pad, vocab=vocab, epsilon=epsilon)
    return loss.sum(), nll.sum()


def chunked_projected_sums(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    epsilon: float,
    bias: Tensor | None,
    ignore_index: int,
    rows: int | None = None,
    passes: ChunkPasses = EAGER,
) -> tuple[Tensor, Tensor]:
    """``Ops.projected_loss`` in chunks (module docstring): the label-smoothed loss of ``h @ weight.T + bias`` (h (N,
    D), weight (V, D), bias (V,) or None, target (N,)) -> (loss_sum, nll_sum), float32 scalars, nll_sum detached,
    without a host sync. Under autocast the products run in the autocast dtype. ``rows``: rows per chunk (None:
    :func:`chunk_rows`); ``passes``: the passes over a chunk's logits."""
    if bias is not None:
        # The bias as one more input feature: h @ W.T + b = [h, 1] @ [W, b].T; autograd carries its gradient back
        # through the concatenation.
        h = torch.cat([h, h.new_ones(h.size(0), 1)], dim=1)  # (N, D) -> (N, D + 1)
        weight = torch.cat([weight, bias.to(weight.dtype)[:, None]], dim=1)  # (V, D) -> (V, D + 1)
    kind = h.device.type
    compute_dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    rows = rows or chunk_rows(weight.size(0))
    with torch.autocast(kind, enabled=False):  # the dtypes are chosen here, chunk by chunk
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            loss, nll = _LossAndGradient.apply(
                h, weight, target, float(epsilon), ignore_index, compute_dtype, rows, passes
            )
            return loss, nll
        return _loss_only(h, weight, target, epsilon, ignore_index, compute_dtype, rows, passes)


def _loss_only(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: int,
    compute_dtype: torch.dtype,
    rows: int,
    passes: ChunkPasses,
) -> tuple[Tensor, Tensor]:
    """The sums without a gradient (validation): the same chunks, one pass over each."""
    pad = target == ignore_index
    safe = target.masked_fill(pad, 0)
    w = weight.detach().to(compute_dtype)
    parts = []
    for start in range(0, h.size(0), rows):
        sl = slice(start, start + rows)
        parts.append(passes.sums(h[sl].detach().to(compute_dtype) @ w.t(), safe[sl]))  # (n, V) logits
    return _summed(parts, pad, vocab=weight.size(0), epsilon=epsilon, like=h)
