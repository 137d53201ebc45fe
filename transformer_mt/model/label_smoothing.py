"""Label-smoothed cross-entropy over given logits (section 5.4 of the paper, eps_ls = 0.1): the formula, which
:mod:`transformer_mt.model.loss` (the training objective) and the reference backend's loss
(:mod:`transformer_mt.model.ops.reference`) both compute; it imports nothing of the model.

Smoothing convention (fairseq's ``label_smoothed_cross_entropy``): the smoothed target
distribution puts 1 - eps on the reference token and eps / (V - 1) on each of the other V - 1
tokens (PAD, BOS and UNK included), so the reference keeps exactly 1 - eps. Szegedy et al. and
``F.cross_entropy(label_smoothing=eps)`` spread eps / V over all V tokens instead (the reference
gets 1 - eps + eps / V); for V in the thousands the two differ by less than eps / V per token.
With eps = 0 both are plain cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_epsilon(epsilon: float, vocab: int) -> None:
    """Refuse an epsilon outside [0, 1), or smoothing over fewer than 2 tokens (ValueError)."""
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon={epsilon} is outside [0, 1); the paper uses 0.1")
    if vocab < 2 and epsilon > 0:
        raise ValueError("label smoothing needs a vocabulary of at least 2 tokens")


def label_smoothed_sums(logits: Tensor, target: Tensor, *, epsilon: float, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed plain NLL of ``logits`` (..., V) against ``target`` (...), positions equal
    to ``ignore_index`` counting for nothing: (loss_sum, nll_sum), float32 scalars (float64 stays float64), nll_sum
    detached, without a host sync (:func:`transformer_mt.model.loss.label_smoothed_nll_loss` adds the count)."""
    vocab = logits.size(-1)
    check_epsilon(epsilon, vocab)
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
    return loss.sum(), nll.detach().sum()
