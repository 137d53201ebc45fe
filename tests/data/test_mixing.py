"""Several corpora in one epoch (data.mixing): the pairs each corpus gives an epoch follow its weight (temperature 0)
or (weight x pairs) ** (1/T) (T > 0), the epoch is a pure function of (seed, epoch), and its batches are today's
token-budget batches over those pairs.

Tolerance of the shares. The pairs each corpus gives an epoch are exact: k_i = round(target), so a pair count is
within 0.5 of its target and a pair share within 0.5 / N of it. The share of target TOKENS also depends on which
pairs a corpus's random subset (its fractional weight) draws: for a subset of m of n pairs whose target lengths have
standard deviation s, its token count varies by s * sqrt(m (1 - m / n)), about 60 tokens here (s ~ 5 pieces, m = 300
of 600) in an epoch of ~40,000: 0.15 points. The token shares are asserted within 1 point of the expectation
(k_i x the corpus's mean target length, over the sum), over 6 standard deviations, so the test does not flake, and
still fails when a weight is applied wrongly (weight 0.5 read as 1 moves that share by over 5 points).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import head
from transformer_mt.config import DataConfig
from transformer_mt.data import MixedCorpus, ParallelData, epoch_pairs, epoch_sample, load_parallel
from transformer_mt.text import Tokenizer

SIZES = (3000, 600, 60)  # a large, a middle and a small corpus


def test_temperature_zero_takes_each_corpus_weight_times() -> None:
    # 2: every pair twice; 0.5: half of them; 1.25: every pair once and a quarter of them again
    assert epoch_pairs([300, 200, 100], [2.0, 0.5, 1.25], 0.0).tolist() == [600, 100, 125]
    sample = epoch_sample([300, 200, 100], [2.0, 0.5, 1.25], 0.0, seed=3, epoch=1)
    counts = np.bincount(sample, minlength=600)
    assert (counts[:300] == 2).all()  # corpus 0: every pair exactly twice
    assert (counts[300:500] <= 1).all() and counts[300:500].sum() == 100  # corpus 1: 100 distinct pairs
    assert (counts[500:] >= 1).all() and (counts[500:] <= 2).all() and counts[500:].sum() == 125


@pytest.mark.parametrize("temperature", [1.0, 5.0, 1e6])
@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (1.0, 3.0, 0.5)])
def test_temperature_shares_follow_weighted_size_to_the_one_over_t(temperature: float, weights: tuple) -> None:
    total = sum(SIZES)
    # p_i = (w_i n_i) ** (1/T) / sum_j (w_j n_j) ** (1/T), from the formula, in plain floats
    raw = [(w * n) ** (1.0 / temperature) for w, n in zip(weights, SIZES)]
    expected = [r / sum(raw) for r in raw]
    counts = epoch_pairs(SIZES, weights, temperature).tolist()
    for k, p in zip(counts, expected):
        assert abs(k - p * total) <= 0.5  # k_i = round(p_i N)
        assert abs(k / total - p) <= 0.5 / total
    if temperature == 1.0 and weights == (1.0, 1.0, 1.0):
        assert counts == list(SIZES)  # by size: each pair once
    if temperature == 1e6:
        assert all(abs(k / total - 1 / 3) < 1e-3 for k in counts)  # a large T: the same share for each
    sample = epoch_sample(SIZES, weights, temperature, seed=1, epoch=2)
    offsets = np.cumsum((0, *SIZES))
    for i, (n, k) in enumerate(zip(SIZES, counts)):
        seen = np.bincount(sample[(sample >= offsets[i]) & (sample < offsets[i + 1])] - offsets[i], minlength=n)
        assert seen.sum() == k and seen.max() - seen.min() <= 1  # whole passes, then each remaining pair at most once


def test_the_epoch_is_a_pure_function_of_seed_and_epoch_and_its_subset_changes() -> None:
    args = ([400, 300], [1.0, 0.5], 0.0)
    first = epoch_sample(*args, seed=5, epoch=1)
    assert np.array_equal(first, epoch_sample(*args, seed=5, epoch=1))
    halves = [set(epoch_sample(*args, seed=5, epoch=e)[400:].tolist()) for e in (1, 2, 3)]
    assert len(halves[0]) == 150 and halves[0] != halves[1] != halves[2]  # another half every epoch
    assert set(epoch_sample(*args, seed=6, epoch=1)[400:].tolist()) != halves[0]


def _corpora(tmp_path, corpus_slice, tok: Tokenizer, spans: list[tuple[int, int]]) -> list[ParallelData]:
    out = []
    for i, (start, stop) in enumerate(spans):
        files = []
        for lang in ("en", "de"):
            path = tmp_path / f"c{i}.{lang}"
            path.write_text("\n".join(head(corpus_slice[f"train.{lang}"], stop - start, skip=start)) + "\n")
            files.append(path)
        out.append(load_parallel(files[0], files[1], tok, tok, DataConfig(), cache_dir=tmp_path / "cache", quiet=True))
    return out


def test_an_epochs_target_tokens_follow_the_weights(tmp_path, corpus_slice, tok) -> None:
    parts = _corpora(tmp_path, corpus_slice, tok, [(0, 900), (900, 1500), (1500, 1800)])
    weights = [2.0, 0.5, 1.0]
    mix = MixedCorpus(parts, names=["a", "b", "c"], weights=weights, temperature=0.0)
    batches = mix.batches(1, max_tokens=1500, seed=1)
    for idx in batches:  # today's budget: max(length) x count per side, pieces + EOS / BOS
        assert len(idx) == 1 or len(idx) * (int(mix.tgt_lengths[idx].max()) + 1) <= 1500
        assert len(idx) == 1 or len(idx) * (int(mix.src_lengths[idx].max()) + 1) <= 1500
    seen = np.concatenate(batches)
    assert np.array_equal(np.sort(seen), np.sort(epoch_sample([900, 600, 300], weights, 0.0, seed=1, epoch=1)))
    tokens = mix.target_tokens(batches)
    mean_len = [(p.tgt_lengths.astype(np.int64) + 1).mean() for p in parts]
    expected = np.array([1800, 300, 300]) * mean_len
    shares, expected = tokens / tokens.sum(), expected / expected.sum()
    assert np.abs(shares - expected).max() < 0.01, (shares, expected)
    # by the batches' own pairs: each pair's corpus is where its index falls
    assert tokens.sum() == sum(int(mix.tgt_lengths[idx].sum()) + len(idx) for idx in batches)


def test_one_corpus_of_weight_one_batches_as_that_corpus(tmp_path, corpus_slice, tok) -> None:
    (part,) = _corpora(tmp_path, corpus_slice, tok, [(0, 700)])
    mix = MixedCorpus([part], names=["train"], weights=[1.0], temperature=0.0)
    for epoch in (1, 2):
        ours = [b.tolist() for b in mix.batches(epoch, max_tokens=900, seed=4)]
        assert ours == [b.tolist() for b in part.batches(epoch, max_tokens=900, seed=4)]
    first = mix.batches(1, max_tokens=900, seed=4)[0]
    assert mix.get_batch(first).src.tolist() == part.get_batch(first).src.tolist()


def test_a_mixed_batch_reads_each_pair_from_its_corpus(tmp_path, corpus_slice, tok) -> None:
    parts = _corpora(tmp_path, corpus_slice, tok, [(0, 50), (50, 80)])
    mix = MixedCorpus(parts, names=["a", "b"], weights=[1.0, 3.0], temperature=0.0)
    assert mix.num_pairs == 80 and mix.corpus_of([0, 49, 50, 79]).tolist() == [0, 0, 1, 1]
    src, tgt = mix.pair(55)
    assert src.tolist() == parts[1].pair(5)[0].tolist() and tgt.tolist() == parts[1].pair(5)[1].tolist()
    assert math.isclose(epoch_pairs([50, 30], [1.0, 3.0], 0.0)[1], 90)
