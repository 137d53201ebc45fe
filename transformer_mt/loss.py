"""Label-smoothed cross-entropy over non-pad target tokens (section 5.4 of the paper, eps_ls = 0.1).

Smoothing convention (fairseq's ``label_smoothed_cross_entropy``): the smoothed target
distribution puts 1 - eps on the reference token and eps / (V - 1) on each of the other V - 1
tokens (PAD, BOS and UNK included), so the reference keeps exactly 1 - eps. Szegedy et al. and
``F.cross_entropy(label_smoothing=eps)`` spread eps / V over all V tokens instead (the reference
gets 1 - eps + eps / V); for V in the thousands the two differ by less than eps / V per token.
With eps = 0 both are plain cross-entropy.

Everything is summed, not averaged: the training loop divides by the number of target tokens
of the whole (possibly accumulated) update, and reports loss per token = loss_sum / ntokens and
perplexity = exp(nll_sum / ntokens), base e, from the *unsmoothed* NLL.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.tokenizer import PAD_ID


def _check_epsilon(epsilon: float, vocab: int) -> None:
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon={epsilon} is outside [0, 1); the paper uses 0.1")
    if vocab < 2 and epsilon > 0:
        raise ValueError("label smoothing needs a vocabulary of at least 2 tokens")


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, *, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed loss, summed plain NLL and the number of counted tokens.

    logits: (..., V), any float dtype; the loss is computed in float32 (float64 stays float64).
    target: (...) long, the same leading shape; positions equal to ``ignore_index`` count for nothing.
    Returns (loss_sum, nll_sum, ntokens): loss_sum a float32 scalar to backpropagate; nll_sum a
    detached float32 scalar for reporting; ntokens a Python int (a device sync on GPU: the
    ``Batch.ntokens`` of the same batch is the same number, known without one).

    Memory: one (N, V) float32 tensor (the log-probabilities) besides the logits; the smoothing
    term uses their row sums rather than an explicit smoothed target distribution.
    """
    vocab = logits.size(-1)
    _check_epsilon(epsilon, vocab)
    dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 / fp16 logits: the loss in float32
    lprobs = F.log_softmax(logits.reshape(-1, vocab), dim=-1, dtype=dtype)  # (N, V)
    target = target.reshape(-1)  # (N,)
    pad = target == ignore_index
    safe_target = target.masked_fill(pad, 0)  # any valid index; the row is masked out below
    nll = -lprobs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1).masked_fill(pad, 0.0)  # (N,)
    if epsilon > 0:
        # -sum_v q(v) log p(v) with q = 1 - eps on the reference and eps / (V - 1) elsewhere:
        # (1 - eps) * nll + eps / (V - 1) * (sum over all v of -log p(v) - nll)
        smooth = (-lprobs.sum(-1)).masked_fill(pad, 0.0)  # (N,)
        eps_i = epsilon / (vocab - 1)
        loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    else:
        loss = nll
    return loss.sum(), nll.detach().sum(), int((~pad).sum())


def perplexity(nll_sum: float | torch.Tensor, ntokens: int) -> float:
    """exp(nll_sum / ntokens), natural base; inf when it overflows, nan for zero tokens."""
    if ntokens <= 0:
        return math.nan
    try:
        return math.exp(float(nll_sum) / ntokens)
    except OverflowError:
        return math.inf


# Rows of the (N, V) logits handled at once by projected_label_smoothed_loss: chunks of at most
# 16 MiB of float32 stay below glibc's largest mmap threshold (32 MiB), so after the first step their
# memory comes back from the heap instead of fresh pages (first-touch page faults cost as much as the
# softmax itself for a (2048, 8000) tensor on 2 cores).
_CHUNK_BYTES = 16 * 2**20


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Per-row label-smoothed loss and NLL of ``h @ weight.T``, fused with the vocabulary projection.

    Forward keeps each chunk's softmax (float32, in the chunk's logits buffer); backward turns it in
    place into d loss / d logits = w * (softmax - q), q the smoothed target distribution, and
    multiplies back through the projection. Compared with ``log_softmax`` + ``gather`` + ``sum``
    under autograd this makes two passes over the (N, V) tensor instead of about eight, and never
    allocates the (N, V) logits or their gradient in one piece.
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int, compute_dtype: torch.dtype):  # noqa: ANN001, PLR0913
        vocab = weight.size(0)
        rows = max(1, _CHUNK_BYTES // (4 * vocab))
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        pad = target == ignore_index
        safe = target.masked_fill(pad, 0)
        w = weight.to(compute_dtype)
        probs, lse_parts, tgt_parts, sum_parts = [], [], [], []
        for start in range(0, h.size(0), rows):
            x = h[start:start + rows].to(compute_dtype) @ w.t()  # (n, V) logits
            x = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 / fp16: the softmax in float32
            tgt_parts.append(x.gather(1, safe[start:start + rows, None]).squeeze(1))
            if epsilon > 0:
                sum_parts.append(x.sum(1))
            m = x.amax(1, keepdim=True)
            x.sub_(m).exp_()
            z = x.sum(1, keepdim=True)
            x.div_(z)  # softmax, kept for backward
            lse_parts.append((m + z.log()).squeeze(1))
            probs.append(x)
        lse = torch.cat(lse_parts)
        nll = (lse - torch.cat(tgt_parts)).masked_fill_(pad, 0.0)
        if epsilon > 0:
            smooth = (vocab * lse - torch.cat(sum_parts)).masked_fill_(pad, 0.0)  # sum over v of -log p(v)
            loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        else:
            loss = nll.clone()
        ctx.save_for_backward(h, weight, safe, pad)
        ctx.probs, ctx.rows, ctx.eps, ctx.eps_i, ctx.compute_dtype = probs, rows, epsilon, eps_i, compute_dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: ANN001, ANN205, ARG004
        h, weight, safe, pad = ctx.saved_tensors
        if ctx.probs is None:
            raise RuntimeError("projected_label_smoothed_loss: backward called twice (its buffers are reused in place)")
        probs, ctx.probs = ctx.probs, None
        cdt = ctx.compute_dtype
        w = weight.to(cdt)
        row_w = grad_loss.to(probs[0].dtype).masked_fill(pad, 0.0) if probs else grad_loss
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device) if ctx.needs_input_grad[1] else None
        on_target = -(1.0 - ctx.eps - ctx.eps_i)
        for i, g in enumerate(probs):  # g: softmax of chunk i -> gradient of its logits, in place
            sl = slice(i * ctx.rows, i * ctx.rows + g.size(0))
            if ctx.eps_i:
                g.sub_(ctx.eps_i)
            g.scatter_add_(1, safe[sl, None], g.new_full((g.size(0), 1), on_target))
            g.mul_(row_w[sl, None])
            g = g.to(cdt)
            if grad_h is not None:
                grad_h[sl] = g @ w
            if grad_w is not None:
                grad_w.add_(g.t() @ h[sl].to(cdt))
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


def projected_label_smoothed_loss(
    h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[Tensor, Tensor, int]:
    """``label_smoothed_nll_loss(h @ weight.T, target)`` without materialising the (N, V) logits at once.

    h: (N, D) decoder states at the label positions; weight: (V, D) output projection (no bias);
    target: (N,). Same returns and same numbers (float32 loss) as :func:`label_smoothed_nll_loss`.
    Under autocast the projection runs in the autocast dtype, the softmax in float32.
    """
    _check_epsilon(epsilon, weight.size(0))
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    with torch.autocast(kind, enabled=False):
        loss, nll = _ProjectedLabelSmoothedLoss.apply(h, weight, target, float(epsilon), ignore_index, dtype)
    return loss.sum(), nll.sum(), int(target.ne(ignore_index).sum())
