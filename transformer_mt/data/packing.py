"""Packed batches: the sentences of a token-budget batch end to end, without padding (flash attention's varlen layout).

A :class:`PackedBatch` is built from the padded :class:`~transformer_mt.data.batching.Batch` that
:func:`~transformer_mt.data.batching.collate` made (where teacher forcing is built, the one place), by keeping each
row's real tokens in row order: the sources (pieces + EOS) in one (Ns,) row, the decoder inputs (start + pieces) and
the labels (pieces + EOS) in one (N,) row each. Where each sentence lies is stated as flash attention's varlen API
takes it: ``cu_seqlens`` (B + 1,) int32 cumulative lengths from 0, and the longest length; each token's position in
its sentence (0 at its first token) places its position vector. The labels are the padded batch's non-pad labels in
the same (row-major) order, so ``ntokens``, the loss normaliser, is the same number.

Everything is computed on the host from the padded tensors, which collation left there: no device sync.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from transformer_mt.data.batching import Batch


@dataclass
class PackedBatch:
    """One batch of sentence pairs packed end to end (the module's docstring). B sentences, Ns source tokens, N
    target tokens.

    src:        (Ns,) long, each source's pieces + EOS, sentence after sentence
    tgt_in:     (N,) long, each decoder input's start + pieces (teacher forcing, as collated)
    tgt_out:    (N,) long, each sentence's labels, pieces + EOS: every position is a label
    src_cu_seqlens, tgt_cu_seqlens: (B + 1,) int32, cumulative lengths from 0: sentence b's source holds src tokens
                [src_cu_seqlens[b], src_cu_seqlens[b + 1]), its target tgt tokens [tgt_cu_seqlens[b], ...)
    src_max_len, tgt_max_len: the longest source and target (decoder input) lengths
    src_positions, tgt_positions: (Ns,), (N,) long, each token's position in its sentence, from 0
    ntokens:    N, the labels (target pieces + 1 per sentence): the padded batch's loss normaliser
    nsentences: B
    indices:    (B,) long or None, the padded batch's pair indices
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    src_cu_seqlens: torch.Tensor
    tgt_cu_seqlens: torch.Tensor
    src_max_len: int
    tgt_max_len: int
    src_positions: torch.Tensor
    tgt_positions: torch.Tensor
    ntokens: int
    nsentences: int
    indices: torch.Tensor | None = None

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> PackedBatch:
        """The batch on ``device``; ``non_blocking`` as :meth:`Batch.to` (copies from page-locked memory to CUDA)."""
        pin = non_blocking and torch.device(device).type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            return (t.pin_memory() if pin and not t.is_pinned() else t).to(device, non_blocking=non_blocking)

        return dataclasses.replace(
            self,
            src=move(self.src),
            tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out),
            src_cu_seqlens=move(self.src_cu_seqlens),
            tgt_cu_seqlens=move(self.tgt_cu_seqlens),
            src_positions=move(self.src_positions),
            tgt_positions=move(self.tgt_positions),
            indices=None if self.indices is None else move(self.indices),
        )


def segments(lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sentence lengths (B,) -> their packed layout: cu_seqlens (B + 1,) int32 from 0, each token's position in its
    sentence (sum of lengths,) long, and the longest length (0 for no sentence)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cu = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], lengths)  # (total,)
    longest = int(lengths.max()) if lengths.size else 0
    return torch.from_numpy(cu.astype(np.int32)), torch.from_numpy(positions), longest


def pack(batch: Batch, *, pad: int) -> PackedBatch:
    """The :class:`PackedBatch` of a padded ``batch`` collated on the host, its padding ``pad`` (the model's pad id).

    A row's length is the count of its non-pad tokens: a source's pieces + EOS, a target's labels (pieces + EOS), which
    the decoder input (start + pieces) shares, its start id counted even where it is the pad id (MarianMT's)."""
    src_real = batch.src.ne(pad)  # (B, S) True at real tokens: they come first in each row
    tgt_real = batch.tgt_out.ne(pad)  # (B, T): pieces + EOS; the decoder input's start + pieces have the same lengths
    src_cu, src_positions, src_max = segments(src_real.sum(1).numpy())
    tgt_cu, tgt_positions, tgt_max = segments(tgt_real.sum(1).numpy())
    return PackedBatch(
        src=batch.src[src_real],  # (B, S) -> (Ns,), row-major: sentence after sentence
        tgt_in=batch.tgt_in[tgt_real],  # (B, T) -> (N,)
        tgt_out=batch.tgt_out[tgt_real],  # (B, T) -> (N,): the padded batch's labels, in the order of Batch.labels
        src_cu_seqlens=src_cu,
        tgt_cu_seqlens=tgt_cu,
        src_max_len=src_max,
        tgt_max_len=tgt_max,
        src_positions=src_positions,
        tgt_positions=tgt_positions,
        ntokens=batch.ntokens,
        nsentences=batch.nsentences,
        indices=batch.indices,
    )
