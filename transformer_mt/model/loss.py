"""Label-smoothed cross-entropy over non-pad target tokens (section 5.4 of the paper, eps_ls = 0.1).

The formula and its smoothing convention (fairseq's: 1 - eps on the reference, eps / (V - 1) on each other token)
are in :mod:`transformer_mt.model.label_smoothing`, which the reference backend computes too.

Everything is summed, not averaged: the training loop divides by the number of target tokens
of the whole (possibly accumulated) update, and reports loss per token = loss_sum / ntokens and
perplexity = exp(nll_sum / ntokens), base e, from the *unsmoothed* NLL.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from transformer_mt.model.attention import Segments
from transformer_mt.model.label_smoothing import check_epsilon, label_smoothed_sums
from transformer_mt.text import PAD_ID

if TYPE_CHECKING:  # the model and its backend are handed in; loss.py never builds one
    from transformer_mt.model.ops import Ops
    from transformer_mt.model.transformer import Transformer


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, *, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed loss, summed plain NLL and the number of counted tokens.

    logits: (..., V), any float dtype; the loss is computed in float32 (float64 stays float64).
    target: (...) long, the same leading shape; positions equal to ``ignore_index`` count for nothing.
    Returns (loss_sum, nll_sum, ntokens): loss_sum a float32 scalar to backpropagate; nll_sum a
    detached float32 scalar for reporting; ntokens a Python int (a device sync on GPU: the
    ``Batch.ntokens`` of the same batch is the same number, known without one; the training loss,
    :class:`TeacherForcedLoss`, never counts).

    Memory: one (N, V) float32 tensor (the log-probabilities) besides the logits; the smoothing
    term uses their row sums rather than an explicit smoothed target distribution.
    """
    loss, nll = label_smoothed_sums(logits, target, epsilon=epsilon, ignore_index=ignore_index)
    return loss, nll, int(target.ne(ignore_index).sum())


def perplexity(nll_sum: float | torch.Tensor, ntokens: int) -> float:
    """exp(nll_sum / ntokens), natural base; inf when it overflows, nan for zero tokens."""
    if ntokens <= 0:
        return math.nan
    try:
        return math.exp(float(nll_sum) / ntokens)
    except OverflowError:
        return math.inf


def projected_label_smoothed_loss(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    epsilon: float,
    ops: Ops,
    bias: Tensor | None = None,
    ignore_index: int = PAD_ID,
) -> tuple[Tensor, Tensor, int]:
    """``label_smoothed_nll_loss(h @ weight.T + bias, target)``, computed by ``ops.projected_loss`` (the CPU and CUDA
    backends fuse the projection with the loss, so the (N, V) logits never exist in one piece).

    h: (N, D) decoder states at the label positions; weight: (V, D) output projection; bias: (V,) or None;
    target: (N,). Same returns and same numbers (float32 loss) as :func:`label_smoothed_nll_loss`.
    """
    loss, nll = projected_label_smoothed_sums(
        h, weight, target, epsilon=epsilon, ops=ops, bias=bias, ignore_index=ignore_index
    )
    return loss, nll, int(target.ne(ignore_index).sum())


def projected_label_smoothed_sums(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    epsilon: float,
    ops: Ops,
    bias: Tensor | None = None,
    ignore_index: int = PAD_ID,
) -> tuple[Tensor, Tensor]:
    """:func:`projected_label_smoothed_loss` without the token count, so without a host sync: (loss_sum, nll_sum)."""
    check_epsilon(epsilon, weight.size(0))
    return ops.projected_loss(h, weight, target, epsilon=epsilon, bias=bias, ignore_index=ignore_index)


class Packing(NamedTuple):
    """A batch's sentences packed end to end, without padding: where each source and each target sentence lies."""

    src: Segments  # the sources (pieces + EOS)
    tgt: Segments  # the decoder inputs (start + pieces), whose labels (pieces + EOS) have the same lengths


class TeacherForcedLoss(nn.Module):
    """The training objective as a module: ``forward(src, tgt_in, tgt_out, labels)`` -> (loss_sum, nll_sum, ntokens).

    This is what DDP wraps (its parameters are the model's own, so DDP reduces the model's gradients);
    checkpoints save ``model.state_dict()``, never this wrapper's, so their keys stay the model's.
    The decoder states at the non-pad label positions go through the vocabulary projection fused with the
    label-smoothed loss (:func:`projected_label_smoothed_loss`): the projection, the largest matmul of a
    small model, skips padding, and the (N, V) logits are never built in one piece.

    No host sync when the batch brings its label positions (``Batch.labels``, found on the host at
    collation) and says whether the source is padded (``Batch.src_padded``): the labels are gathered by
    index, and ntokens is their number, a shape.

    Packed sentences (``packing``, from ``data.pack``): the same sums without computing on padding; every packed
    target position is a label. Dropout masks are drawn over the packed layout, so in training with dropout the two
    layouts give different (equally distributed) numbers; without dropout the same up to float rounding.
    """

    def __init__(self, model: Transformer, *, label_smoothing: float):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        labels: Tensor | None = None,
        *,
        src_padded: bool = True,
        packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor, int]:
        """src (B, S), tgt_in (B, T) = start + y, tgt_out (B, T) = y + EOS, all right-padded -> the sums of
        :func:`label_smoothed_nll_loss` over the non-pad labels: loss_sum, nll_sum (float32 scalars), ntokens.
        ``labels`` (N,): flat positions of the non-pad labels in (B, T) (``Batch.labels``; None: found here,
        a host sync); ``src_padded`` False: no source row has padding (``Batch.src_padded``).
        With ``packing``: src (Ns,), tgt_in and tgt_out (N,) packed end to end (``data.PackedBatch``), every position
        a label; ``labels`` and ``src_padded`` are not used."""
        if packing is not None:
            enc = self.model.encode_packed(src, packing.src)
            h = self.model.decoder_output_packed(tgt_in, packing.tgt, enc)  # (N, D)
            target = self.model.output_targets(tgt_out)  # (N,)
        else:
            h, target = self._padded_labels(src, tgt_in, tgt_out, labels, src_padded=src_padded)
        model = self.model
        # ignore_index -1: the labels were selected above, so no target is padding (and an id such as MarianMT's EOS 0
        # must not be taken for it)
        loss, nll = projected_label_smoothed_sums(
            h,
            model.output_weight(),
            target,
            epsilon=self.label_smoothing,
            ops=model.ops,
            bias=model.output_bias(),
            ignore_index=-1,
        )
        return loss, nll, target.numel()

    def _padded_labels(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, labels: Tensor | None, *, src_padded: bool
    ) -> tuple[Tensor, Tensor]:
        """A padded batch's top decoder states (N, D) and targets (N,) at its N non-pad labels (:meth:`forward`)."""
        enc = self.model.encode(src, padded=src_padded)
        h = self.model.decoder_output(tgt_in, enc)  # (B, T, D)
        if labels is None:
            labels = tgt_out.reshape(-1).ne(self.model.specials.pad).nonzero().squeeze(1)  # (N,)
        h = h.reshape(-1, h.size(-1)).index_select(0, labels)  # (B*T, D) -> (N, D): only positions with a label
        # output_weight(): (V, D), or (K, D) with model.restrict_output (targets then remapped, smoothing over the K
        # kept pieces)
        return h, self.model.output_targets(tgt_out.reshape(-1).index_select(0, labels))  # (N,)
