"""Several training corpora as one: which pairs an epoch takes from each, and :class:`MixedCorpus`, the corpora
batched together.

An epoch's pairs (:func:`epoch_sample`). Corpus i holds n_i pairs and has weight w_i (``data.corpora[i].weight``);
the epoch takes k_i of its pairs, as whole passes over the corpus plus a random subset of the rest:
every pair floor(k_i / n_i) times, and k_i mod n_i pairs drawn without replacement from a generator seeded by
(seed, epoch, i), so that the subset differs from epoch to epoch and a corpus with weight 0.5 is seen whole over
two epochs on average. ``data.sampling_temperature`` T says what k_i is:

- T = 0: k_i = floor(w_i) n_i + round(frac(w_i) n_i), the corpus taken w_i times (2: every pair twice; 0.5: a
  different half every epoch; 1 for every corpus: each pair once, the corpora simply concatenated);
- T > 0: p_i = (w_i n_i) ** (1/T) / sum_j (w_j n_j) ** (1/T) and k_i = round(p_i N) over an epoch of
  N = sum_j n_j pairs: temperature-based sampling (Arivazhagan et al., 2019, "Massively Multilingual Neural
  Machine Translation in the Wild", section 4.2; fairseq's multilingual task, ``--sampling-temperature``).
  T = 1 samples by (weighted) size, T = 5 is the papers' flattening that raises small corpora, and a large T
  gives every corpus the same share. With the weights all 1 and T = 1, k_i = n_i: each pair once.

The epoch's pairs (a list of global pair indices, repeats included) are a pure function of (seed, epoch); they are
then cut into token-budget batches by :func:`~transformer_mt.data.batching.make_batches` as one corpus would be,
so the epoch's batch list is a pure function of (seed, epoch) too, and a resumed run continues at batch k of it.

Global pair indices: corpus i's pair j is ``offsets[i] + j``, the corpora in the order of ``data.corpora``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transformer_mt.data.batching import Batch, Ids, collate_pairs, make_batches
from transformer_mt.data.corpus import ParallelData
from transformer_mt.data.sampling import SampledSegmentation

_STREAM = 0x6D6978  # "mix": the sample's generators differ from make_batches' (seed, epoch) one


def epoch_pairs(sizes: Sequence[int], weights: Sequence[float], temperature: float) -> np.ndarray:
    """(K,) int64: the pairs k_i each corpus gives an epoch (see the module docstring)."""
    n = np.asarray(sizes, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if n.shape != w.shape or n.ndim != 1:
        raise ValueError(f"sizes {n.shape} and weights {w.shape} must be 1-D and of equal size")
    if (w <= 0).any() or (n < 0).any() or temperature < 0:
        raise ValueError("weights must be positive, sizes and the temperature not negative")
    if temperature == 0:
        whole = np.floor(w)
        return (whole * n + np.floor((w - whole) * n + 0.5)).astype(np.int64)
    present = n > 0
    # p_i proportional to (w_i n_i) ** (1/T), computed in logs: a large T or a huge corpus neither over- nor underflows
    logits = np.full(n.shape, -np.inf)
    logits[present] = (np.log(w[present]) + np.log(n[present])) / temperature
    p = np.exp(logits - logits[present].max()) if present.any() else np.zeros_like(n)
    p /= max(p.sum(), 1e-300)
    return np.floor(p * n.sum() + 0.5).astype(np.int64)


def epoch_sample(
    sizes: Sequence[int], weights: Sequence[float], temperature: float, *, seed: int, epoch: int
) -> np.ndarray:
    """(sum k_i,) int64: the global indices of epoch ``epoch``'s pairs, corpus after corpus, each corpus's whole
    passes first, then its random subset; a pure function of (seed, epoch) and the arguments."""
    counts = epoch_pairs(sizes, weights, temperature)
    offsets = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    parts = []
    for i, (n, k) in enumerate(zip(sizes, counts.tolist())):
        if n == 0 or k == 0:
            continue
        passes, rest = divmod(k, n)
        rng = np.random.default_rng([seed & 0xFFFF_FFFF_FFFF_FFFF, epoch & 0xFFFF_FFFF_FFFF_FFFF, _STREAM, i])
        local = np.concatenate([np.tile(np.arange(n, dtype=np.int64), passes), rng.choice(n, size=rest, replace=False)])
        parts.append(offsets[i] + local)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


Part = ParallelData | SampledSegmentation  # one corpus of the mix: encoded, or re-segmented every epoch


class MixedCorpus:
    """Several training corpora batched together, each epoch's pairs drawn by :func:`epoch_sample`.

    It stands in for one :class:`ParallelData` in training: ``batches(epoch, ...)`` gives the epoch's batches of
    global pair indices, ``get_batch`` / ``pair`` read them, ``src_lengths`` / ``tgt_lengths`` (N,) are the pieces
    of every pair of every corpus (N = the pairs of all corpora, each once). Corpora re-segmented every epoch
    (:class:`SampledSegmentation`) are re-segmented when the epoch is batched.
    """

    def __init__(self, parts: Sequence[Part], *, names: Sequence[str], weights: Sequence[float], temperature: float):
        if not parts or not len(parts) == len(names) == len(weights):
            raise ValueError("a mix needs one name and one weight per corpus, and at least one corpus")
        self.parts, self.names, self.weights = list(parts), list(names), [float(w) for w in weights]
        self.temperature = float(temperature)
        self.specials = parts[0].specials
        self.sizes = [p.num_pairs for p in self.parts]
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes, dtype=np.int64)))
        self.num_pairs = int(self.offsets[-1])
        self._lengths()
        self._memo: tuple[tuple, list[np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.num_pairs

    def _lengths(self) -> None:
        self.src_lengths = np.concatenate([np.asarray(p.src_lengths) for p in self.parts])
        self.tgt_lengths = np.concatenate([np.asarray(p.tgt_lengths) for p in self.parts])

    def epoch_pairs(self) -> np.ndarray:
        """(K,) the pairs each corpus gives an epoch (:func:`epoch_pairs`)."""
        return epoch_pairs(self.sizes, self.weights, self.temperature)

    def corpus_of(self, indices: Ids) -> np.ndarray:
        """The corpus (0..K-1) of each global pair index."""
        return np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right") - 1

    def target_tokens(self, batches: Sequence[Ids]) -> np.ndarray:
        """(K,) int64: the target tokens (pieces + EOS) of ``batches`` by corpus, from the lengths on the host."""
        out = np.zeros(len(self.parts), np.int64)
        for idx in batches:
            idx = np.asarray(idx, dtype=np.int64)
            np.add.at(out, self.corpus_of(idx), self.tgt_lengths[idx].astype(np.int64) + 1)
        return out

    def batches(self, epoch: int, *, max_tokens: int, seed: int, shuffle: bool = True) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches of global pair indices: its sample (:func:`epoch_sample`) cut by
        :func:`make_batches` (each batch's pairs in length order); deterministic."""
        args = (epoch, max_tokens, seed, shuffle)
        if self._memo is None or self._memo[0] != args:
            resegmented = [p for p in self.parts if isinstance(p, SampledSegmentation)]
            for part in resegmented:
                part.segment(epoch)
            if resegmented:
                self._lengths()
            sample = epoch_sample(self.sizes, self.weights, self.temperature, seed=seed, epoch=epoch)
            # +1: the EOS on the source and the BOS / EOS on the target occupy a position each
            local = make_batches(
                self.src_lengths[sample] + 1, self.tgt_lengths[sample] + 1, max_tokens, seed=seed, epoch=epoch,
                shuffle=shuffle,
            )  # fmt: skip
            self._memo = (args, [sample[b] for b in local])
        return list(self._memo[1])  # a copy: callers may reorder or slice it

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Source (its tags first) and target piece ids of global pair i, without EOS / BOS."""
        k = int(self.corpus_of([i])[0])
        return self.parts[k].pair(i - int(self.offsets[k]))

    def get_batch(self, indices: Ids, *, pad_to_multiple: int = 0) -> Batch:
        """The :class:`Batch` of the global pairs ``indices``, in that order (``pad_to_multiple``: collate's)."""
        return collate_pairs(self, indices, pad_to_multiple=pad_to_multiple)
