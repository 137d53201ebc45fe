"""Subword regularisation: the cached corpus re-segmented by sampling every epoch, on real Multi30k."""

from __future__ import annotations

import numpy as np

from transformer_mt.config import DataConfig
from transformer_mt.data import SampledSegmentation, load_parallel
from transformer_mt.text import BOS_ID, EOS_ID, Tokenizer, train_sentencepiece


def _segmentation(s: SampledSegmentation) -> list[tuple[list[int], list[int]]]:
    return [tuple(x.tolist() for x in s.pair(i)) for i in range(s.num_pairs)]


def test_sampled_segmentation_is_a_seeded_resegmentation_of_the_same_text(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=100),
        cache_dir=tmp_path,
        quiet=True,
    )
    best = [tuple(x.tolist() for x in d.pair(i)) for i in range(d.num_pairs)]
    s = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=5, max_len=100)
    assert _segmentation(s) == best  # before the first epoch: the cached best segmentation
    s.batches(1, max_tokens=800, seed=5)
    e1 = _segmentation(s)
    for side in (0, 1):  # the same text, other pieces
        assert tok.decode([p[side] for p in e1]) == tok.decode([p[side] for p in best])
        changed = sum(a[side] != b[side] for a, b in zip(e1, best)) / len(best)
        assert changed > 0.5, f"alpha 0.3 re-segments most sentences, side {side}: {changed:.2f}"
    assert s.last_stats["tgt_piece_ratio"] > 1.02 and s.last_stats["epoch"] == 1
    assert np.array_equal(s.tgt_lengths, [len(p[1]) for p in e1])

    again = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=5, max_len=100)  # a resumed run, another rank
    again.batches(1, max_tokens=800, seed=5)
    assert _segmentation(again) == e1
    s.batches(2, max_tokens=800, seed=5)
    e2 = _segmentation(s)
    assert sum(a != b for a, b in zip(e1, e2)) > 0.5 * len(e1)
    other = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=6, max_len=100)
    other.batches(1, max_tokens=800, seed=5)
    assert sum(a != b for a, b in zip(e1, _segmentation(other))) > 0.5 * len(e1)
    s.batches(1, max_tokens=800, seed=5)  # back to epoch 1 (resuming there): the same pieces again
    assert _segmentation(s) == e1


def test_sampled_batches_cover_each_pair_once_within_budget(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=100),
        cache_dir=tmp_path,
        quiet=True,
    )
    s = SampledSegmentation(d, tok, tok, alpha=0.2, nbest=-1, seed=1, max_len=100)
    batches = s.batches(3, max_tokens=600, seed=1)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(d.num_pairs))
    for idx in batches:
        b = s.get_batch(idx)
        assert b.src.numel() <= 600 and b.tgt_in.numel() <= 600
        for row, i in enumerate(idx[:3]):
            src, tgt = (x.tolist() for x in s.pair(int(i)))
            assert b.src[row, : len(src) + 1].tolist() == src + [EOS_ID]
            assert b.tgt_in[row, : len(tgt) + 1].tolist() == [BOS_ID] + tgt
            assert b.tgt_out[row, : len(tgt) + 1].tolist() == tgt + [EOS_ID]


def test_sampled_pairs_over_max_len_keep_their_best_segmentation(tmp_path, corpus_slice, tok):
    limit = 20
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=limit),
        cache_dir=tmp_path,
        quiet=True,
    )
    capped = SampledSegmentation(d, tok, tok, alpha=0.1, nbest=-1, seed=3, max_len=limit)
    free = SampledSegmentation(d, tok, tok, alpha=0.1, nbest=-1, seed=3, max_len=10_000)  # the same draws, no cap
    capped.segment(1)
    free.segment(1)
    over = [i for i in range(d.num_pairs) if max(len(x) for x in free.pair(i)) > limit]
    assert len(over) > 10, "alpha 0.1 lengthens some pairs past the cap"
    assert max(capped.src_lengths.max(), capped.tgt_lengths.max()) <= limit
    for i in over:
        sampled, best = free.pair(i), d.pair(i)
        for side in (0, 1):
            expected = best[side] if len(sampled[side]) > limit else sampled[side]
            assert capped.pair(i)[side].tolist() == expected.tolist()


def test_bpe_models_sample_by_dropping_merges(tmp_path, corpus_slice):
    bpe = Tokenizer(
        train_sentencepiece(
            [corpus_slice["train.en"], corpus_slice["train.de"]], tmp_path / "bpe", vocab_size=1000, model_type="bpe"
        )
    )
    d = load_parallel(
        corpus_slice["val.en"], corpus_slice["val.de"], bpe, bpe, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    s = SampledSegmentation(d, bpe, bpe, alpha=0.1, nbest=-1, seed=1, max_len=256)
    s.segment(1)
    e1 = _segmentation(s)
    best = [tuple(x.tolist() for x in d.pair(i)) for i in range(d.num_pairs)]
    assert sum(a != b for a, b in zip(e1, best)) > 0.3 * len(best)
    assert bpe.decode([p[1] for p in e1]) == bpe.decode([p[1] for p in best])
