"""Subword regularisation (``data.sampling``): a training corpus re-segmented by sampling every epoch."""

from __future__ import annotations

import itertools
import time

import numpy as np
import sentencepiece as spm

from transformer_mt.data.batching import Batch, Ids, collate_pairs, make_batches
from transformer_mt.data.corpus import ParallelData
from transformer_mt.text import Tokenizer


class SampledSegmentation:
    """Subword regularisation (Kudo, 2018; BPE-dropout for bpe models): a training corpus whose
    pairs are re-segmented by sampling at the start of every epoch.

    It reads the kept pairs' text once and keeps it in memory; each epoch both sides are encoded
    again with sentencepiece sampling (unigram: from the n best segmentations, smoothed by
    ``alpha``; bpe: merges dropped with probability ``alpha``). The same (seed, epoch) always gives
    the same segmentation: sentencepiece's generator is seeded before each side is encoded in one
    call on one thread (its multi-threaded encoder hands sentences to threads in a racy order).
    A resumed run and every rank of a distributed run therefore see the same pieces and batches.
    A pair whose sampled segmentation is longer than ``max_len`` on a side keeps its best
    segmentation for that epoch. Validation and translation never sample. The tags a corpus's sources start with
    (``ParallelData.src_prefix``), and an NLLB model's target codes (``tgt_prefix``), stay one piece each, ahead
    of the sampled sentence.

    It stands in for the :class:`ParallelData` it wraps: ``batches(epoch, ...)`` re-segments for
    that epoch and ``get_batch`` / ``pair`` read the segmentation of the epoch last batched.
    """

    def __init__(
        self,
        base: ParallelData,
        src_tok: Tokenizer,
        tgt_tok: Tokenizer,
        *,
        alpha: float,
        nbest: int,
        seed: int,
        max_len: int,
    ):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        self.base, self.summary, self.num_pairs, self.line_numbers = (
            base,
            base.summary,
            base.num_pairs,
            base.line_numbers,
        )
        self.specials, self.src_prefix, self.tgt_prefix = base.specials, base.src_prefix, base.tgt_prefix
        self.alpha, self.nbest, self.seed, self.max_len = alpha, nbest, seed, max_len
        self._toks = {"src": src_tok, "tgt": tgt_tok}
        self._texts = {side: base.texts(side) for side in ("src", "tgt")}
        self._epoch: int | None = None
        self._tokens: dict[str, np.ndarray] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self.src_lengths, self.tgt_lengths = base.src_lengths, base.tgt_lengths
        self.last_stats: dict[
            str, float
        ] = {}  # of the latest re-segmentation: seconds, piece ratios to the best segmentation

    def __len__(self) -> int:
        return self.num_pairs

    def texts(self, side: str) -> list[str]:
        return list(self._texts[side])

    def segment(self, epoch: int) -> None:
        """Sample epoch ``epoch``'s segmentation of every pair (a no-op if it is the current one)."""
        if epoch == self._epoch:
            return
        tic = time.perf_counter()
        stats: dict[str, float] = {}
        for k, side in enumerate(("src", "tgt")):
            best = getattr(self.base, f"{side}_lengths")
            spm.set_random_generator_seed(
                int(np.random.SeedSequence([self.seed & 0xFFFF_FFFF, epoch & 0xFFFF_FFFF, k]).generate_state(1)[0])
            )
            seqs = self._toks[side].encode(self._texts[side], alpha=self.alpha, nbest=self.nbest)
            prefix = self.src_prefix if side == "src" else self.tgt_prefix
            if prefix:  # the tags, one piece each, are never sampled
                seqs = [prefix + ids for ids in seqs]
            lengths = np.fromiter(map(len, seqs), np.int32, count=len(seqs))
            for i in np.flatnonzero(lengths > self.max_len).tolist():  # too long this epoch: the best one
                seqs[i] = self.base.pair(i)[k].tolist()
                lengths[i] = best[i]
            self._tokens[side] = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, count=int(lengths.sum()))
            self._offsets[side] = (
                np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64)))
                if len(lengths)
                else np.zeros(0, np.int64)
            )
            setattr(self, f"{side}_lengths", lengths)
            stats[f"{side}_piece_ratio"] = float(lengths.sum()) / max(int(best.sum()), 1)
        self._epoch = epoch
        self.last_stats = {"epoch": epoch, "seconds": time.perf_counter() - tic, **stats}

    def batches(self, epoch: int, *, max_tokens: int, seed: int, shuffle: bool = True) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches over its sampled lengths (see :func:`make_batches`); deterministic."""
        self.segment(epoch)
        return make_batches(
            self.src_lengths + 1, self.tgt_lengths + 1, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle
        )

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Pair i as segmented for the current epoch (its best segmentation before the first)."""
        if self._epoch is None:
            return self.base.pair(i)
        s, t = int(self._offsets["src"][i]), int(self._offsets["tgt"][i])
        return self._tokens["src"][s : s + self.src_lengths[i]], self._tokens["tgt"][t : t + self.tgt_lengths[i]]

    def get_batch(self, indices: Ids, *, pad_to_multiple: int = 0) -> Batch:
        """The :class:`Batch` of the pairs ``indices`` as segmented for this epoch (ParallelData's collation)."""
        return collate_pairs(self, indices, pad_to_multiple=pad_to_multiple)
