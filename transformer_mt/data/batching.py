"""Batches: the :class:`Batch` that builds teacher forcing in one place, token-budget batching and sharding.

Conventions (fairseq's, section 5 of the paper): a source is its pieces + EOS; the decoder input
``tgt_in`` is the decoder's start id (BOS for the models tmt trains) + target pieces; the labels
``tgt_out`` are target pieces + EOS. Sequences are right-padded with the pad id. The ids are the
model's :class:`~transformer_mt.text.SpecialIds`; :func:`collate` is the only code that adds them.

Batching. Pairs are sorted by (target length, source length) with a seeded random tie-break and
cut greedily into batches whose padded size, max(len) x count on each side, stays within
``max_tokens`` (a pair over budget alone forms a batch); batch order is then shuffled. Both draw
on ``numpy.random.default_rng([seed, epoch])`` (a seed sequence, so that (seed=1, epoch=2) and
(seed=2, epoch=1) differ, unlike seed + epoch): epoch e's batches are a pure function of
(seed, epoch), and a run resumed at batch k of an epoch sees exactly the remaining batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from transformer_mt.text import DEFAULT, SpecialIds

Ids = Sequence[int] | np.ndarray  # token or pair ids: a list, or a 1-D integer array


@dataclass
class Batch:
    """One batch of sentence pairs; teacher forcing is built here and nowhere else.

    src:      (B, S) long, source pieces + EOS, right-padded with the pad id
    tgt_in:   (B, T) long, start + target pieces (decoder input, the target shifted right), padded
    tgt_out:  (B, T) long, target pieces + EOS (labels), padded; the loss ignores padding
    ntokens:  non-pad tokens of tgt_out (target pieces + 1 per sentence), the loss normaliser
    nsentences: B
    indices:  (B,) long or None, pair indices in the ParallelData (its ``line_numbers`` map them to lines)
    labels:   (ntokens,) long or None, the flat positions (row-major in (B, T)) of tgt_out's non-pad labels,
              known here from the lengths: the loss selects them without asking the device (a boolean
              mask would make the host wait for the GPU, twice: forward and backward)
    src_padded: whether any source row is shorter than S (False: attention over the source needs no mask)
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    ntokens: int
    nsentences: int
    indices: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    src_padded: bool = True

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """The batch on ``device``. ``non_blocking`` to CUDA copies from page-locked (pinned) memory, so that
        the host neither waits for the copy nor for the GPU (a copy from pageable memory synchronises the stream)."""
        pin = non_blocking and torch.device(device).type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            return (t.pin_memory() if pin and not t.is_pinned() else t).to(device, non_blocking=non_blocking)

        return dataclasses.replace(
            self,
            src=move(self.src),
            tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out),
            indices=None if self.indices is None else move(self.indices),
            labels=None if self.labels is None else move(self.labels),
        )


def _pad(
    seqs: Sequence[Ids], *, pad: int, prefix: int | None = None, suffix: int | None = None, multiple: int = 1
) -> torch.Tensor:
    """(B, max len + extras) int64 rows of prefix + seq + suffix, right-padded with ``pad``; the width rounded up to a
    multiple of ``multiple``."""
    lengths = [len(s) for s in seqs]
    start = int(prefix is not None)
    width = max(lengths, default=0) + start + int(suffix is not None)
    out = np.full((len(seqs), -(-width // multiple) * multiple), pad, dtype=np.int64)
    for row, (seq, n) in enumerate(zip(seqs, lengths)):
        if prefix is not None:
            out[row, 0] = prefix
        out[row, start : start + n] = seq
        if suffix is not None:
            out[row, start + n] = suffix
    return torch.from_numpy(out)


def source_tensor(seqs: Sequence[Ids], *, specials: SpecialIds = DEFAULT) -> torch.Tensor:
    """(B, S) long: each source's pieces + EOS, right-padded with the pad id (also for translation)."""
    return _pad(seqs, pad=specials.pad, suffix=specials.eos)


def collate(
    pairs: Sequence[tuple[Ids, Ids]],
    *,
    indices: Ids | None = None,
    specials: SpecialIds = DEFAULT,
    pad_to_multiple: int = 0,
) -> Batch:
    """Build a :class:`Batch` from (source ids, target ids) pairs given without start/EOS,
    with the model's ``specials``. ``pad_to_multiple``: S and T padded up to a multiple of it (0 or 1: to the longest
    row), so that a compiled model sees fewer shapes; the padding is masked like any other."""
    multiple = max(pad_to_multiple, 1)
    srcs = [p[0] for p in pairs]
    tgts = [p[1] for p in pairs]
    src_lengths = np.fromiter(map(len, srcs), np.int64, count=len(srcs))
    labels_per_row = np.fromiter(map(len, tgts), np.int64, count=len(tgts)) + 1  # pieces + EOS
    src = _pad(srcs, pad=specials.pad, suffix=specials.eos, multiple=multiple)  # (B, S)
    tgt_out = _pad(tgts, pad=specials.pad, suffix=specials.eos, multiple=multiple)  # (B, T)
    return Batch(
        src=src,
        tgt_in=_pad(
            tgts, pad=specials.pad, prefix=specials.start, multiple=multiple
        ),  # section 5: the decoder input is the target shifted right
        tgt_out=tgt_out,
        ntokens=int(labels_per_row.sum()),
        nsentences=len(pairs),
        indices=None if indices is None else torch.as_tensor(np.asarray(indices, dtype=np.int64)),
        labels=torch.from_numpy(
            np.flatnonzero(np.arange(tgt_out.size(1)) < labels_per_row[:, None])
        ),  # (B, T) -> (ntokens,)
        src_padded=bool(src_lengths.size and src_lengths.min() + 1 < src.size(1)),  # + 1: the EOS
    )


class PairSource(Protocol):
    """A corpus that hands out pair i's source and target piece ids (ParallelData, SampledSegmentation), and the
    special ids its batches are built with (its target tokenizer's)."""

    specials: SpecialIds

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


def collate_pairs(data: PairSource, indices: Ids, *, pad_to_multiple: int = 0) -> Batch:
    """The :class:`Batch` of the pairs ``indices`` of ``data``, in that order (``pad_to_multiple``: :func:`collate`)."""
    return collate(
        [data.pair(int(i)) for i in indices], indices=indices, specials=data.specials, pad_to_multiple=pad_to_multiple
    )


# --------------------------------------------------------------------------- batching


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFF_FFFF_FFFF_FFFF, epoch & 0xFFFF_FFFF_FFFF_FFFF])


def make_batches(
    lengths_src, lengths_tgt, max_tokens: int, *, seed: int, epoch: int, shuffle: bool = True
) -> list[np.ndarray]:
    """Split pair indices into batches of at most ``max_tokens`` padded tokens per side.

    ``lengths_*`` (N,) are the lengths the pairs occupy in the padded tensors (ParallelData passes
    pieces + 1 for the EOS / BOS). A batch's size on a side is max(length) x count; a single pair
    over budget forms its own batch. Pairs are sorted by (target, source) length, ties broken by a
    random permutation drawn from (seed, epoch); batch order is shuffled from the same generator.
    With ``shuffle=False`` ties keep index order and batches stay shortest-first (for evaluation).
    Returns a list of int64 arrays of pair indices covering every pair exactly once.
    """
    ls = np.asarray(lengths_src, dtype=np.int64)
    lt = np.asarray(lengths_tgt, dtype=np.int64)
    if ls.shape != lt.shape or ls.ndim != 1:
        raise ValueError(f"lengths_src {ls.shape} and lengths_tgt {lt.shape} must be 1-D and of equal size")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be at least 1")
    if ls.size == 0:
        return []
    rng = _rng(seed, epoch)
    tiebreak = rng.permutation(ls.size) if shuffle else np.arange(ls.size)
    order = tiebreak[np.lexsort((ls[tiebreak], lt[tiebreak]))]  # lexsort is stable: the last key is primary
    # Greedy cut along the sorted order: a batch starting at i holds at most
    # max_tokens // max(ls[i], lt[i]) pairs, and as pairs are added its size, max(running max) x
    # count, never decreases (target lengths are sorted), so one searchsorted finds where it ends.
    s_sorted, t_sorted = ls[order], lt[order]
    cuts, i = [], 0
    while i < order.size:
        window = slice(i, i + max(1, max_tokens // max(int(s_sorted[i]), int(t_sorted[i]))))
        longest = np.maximum(np.maximum.accumulate(s_sorted[window]), t_sorted[window])
        sizes = longest * np.arange(1, longest.size + 1)
        i += max(1, int(np.searchsorted(sizes, max_tokens, side="right")))  # a pair over budget goes alone
        cuts.append(i)
    batches = np.split(order, cuts[:-1])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shard(batches: Sequence, rank: int, world_size: int, *, drop_remainder: bool = True) -> list:
    """Rank r's share for data-parallel training: batches r, r + W, r + 2W, ...

    With ``drop_remainder`` (training) the last len % W batches are dropped so every rank takes
    the same number of steps; they differ each epoch, so no pair is left out for good. Use
    ``drop_remainder=False`` for evaluation, where every pair counts and ranks may differ by one.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
    end = len(batches) // world_size * world_size if drop_remainder else len(batches)
    return list(batches[rank:end:world_size])
