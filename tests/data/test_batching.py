"""Token-budget batches, sharding and the Batch (teacher forcing built in one place), on real Multi30k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_mt.config import DataConfig
from transformer_mt.data import collate, load_parallel, make_batches, shard
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID


def test_batches_respect_budget_and_cover_each_pair_once(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    ls, lt = d.src_lengths + 1, d.tgt_lengths + 1  # EOS / BOS
    for max_tokens in (200, 1000):
        batches = d.batches(3, max_tokens=max_tokens, seed=7)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(d.num_pairs))
        pad = real = 0
        for idx in batches:
            assert len(idx) * max(ls[idx].max(), lt[idx].max()) <= max_tokens
            b = d.get_batch(idx)
            assert b.src.numel() <= max_tokens and b.tgt_in.numel() <= max_tokens
            pad += int((b.tgt_out == PAD_ID).sum())
            real += b.ntokens
        assert pad / (pad + real) < 0.02  # sorted by target length: almost no target padding

    # Greedy and maximal: without shuffling, the first pair of each batch would not fit into the previous one.
    batches = make_batches(ls, lt, 500, seed=7, epoch=0, shuffle=False)
    for prev, nxt in zip(batches, batches[1:]):
        grown = np.append(prev, nxt[0])
        assert len(grown) * max(ls[grown].max(), lt[grown].max()) > 500
    assert [lt[b].max() for b in batches] == sorted(lt[b].max() for b in batches)


def test_batch_order_is_a_function_of_seed_and_epoch(tmp_path, corpus_slice, tok):
    args = (corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig())
    d1 = load_parallel(*args, cache_dir=tmp_path, quiet=True)
    d2 = load_parallel(*args, cache_dir=tmp_path, quiet=True)  # a resumed run: a fresh object
    same = lambda a, b: len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))  # noqa: E731
    e1 = d1.batches(1, max_tokens=800, seed=3)
    assert same(e1, d2.batches(1, max_tokens=800, seed=3))
    assert same(e1[5:], d2.batches(1, max_tokens=800, seed=3)[5:])
    e2 = d1.batches(2, max_tokens=800, seed=3)
    assert not same(e1, e2) and [b[0] for b in e1[:10]] != [b[0] for b in e2[:10]]
    assert not same(e1, d1.batches(1, max_tokens=800, seed=4))
    assert not same(d1.batches(1, max_tokens=800, seed=2), d1.batches(2, max_tokens=800, seed=1))  # not seed + epoch


def test_batches_equal_a_naive_greedy_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 400))
        ls, lt = rng.integers(1, 80, n), rng.integers(1, int(rng.integers(2, 80)), n)
        max_tokens = int(rng.integers(1, 600))
        order = sorted(range(n), key=lambda i: (lt[i], ls[i], i))
        want: list[list[int]] = []
        current: list[int] = []
        for i in order:  # add while max(len) x count stays within budget on both sides
            grown = current + [i]
            if current and len(grown) * max(max(ls[grown]), max(lt[grown])) > max_tokens:
                want.append(current)
                grown = [i]
            current = grown
        want.append(current)
        got = make_batches(ls, lt, max_tokens, seed=5, epoch=0, shuffle=False)
        assert [b.tolist() for b in got] == want


def test_single_pair_over_budget_gets_its_own_batch_and_shard():
    batches = make_batches([30, 2, 2, 2], [2, 2, 2, 3], 8, seed=0, epoch=0, shuffle=False)
    # sorted by (target, source) length: 1, 2, 0, 3; pair 0 (30 tokens > 8) stands alone
    assert [b.tolist() for b in batches] == [[1, 2], [0], [3]]
    items = list(range(10))
    assert [shard(items, r, 3) for r in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert shard(items, 0, 3, drop_remainder=False) == [0, 3, 6, 9]
    with pytest.raises(ValueError):
        shard(items, 3, 3)
    assert make_batches([], [], 10, seed=0, epoch=0) == []


# --------------------------------------------------------------------------- the Batch


def test_collate_builds_teacher_forcing_in_one_place():
    b = collate([([5, 6, 7], [10]), ([8], [11, 12, 13])], indices=[4, 9])
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 10, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, EOS_ID]]
    assert b.indices is not None
    assert (b.ntokens, b.nsentences, b.indices.tolist()) == (6, 2, [4, 9])
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.long
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.ntokens == 6


def test_get_batch_rows_match_the_pairs(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["val.en"],
        corpus_slice["val.de"],
        tok,
        tok,
        DataConfig(),
        cache_dir=tmp_path,
        filter_long=False,
        quiet=True,
    )
    idx = d.batches(1, max_tokens=600, seed=1)[0]
    b = d.get_batch(idx)
    assert b.indices is not None
    assert b.nsentences == len(idx) and b.indices.tolist() == idx.tolist()
    assert b.ntokens == int((d.tgt_lengths[idx] + 1).sum()) == int((b.tgt_out != PAD_ID).sum())
    for row, i in enumerate(idx):
        s, t = (x.tolist() for x in d.pair(i))
        assert b.src[row].tolist() == s + [EOS_ID] + [PAD_ID] * (b.src.size(1) - len(s) - 1)
        assert b.tgt_in[row].tolist() == [BOS_ID] + t + [PAD_ID] * (b.tgt_in.size(1) - len(t) - 1)
        assert b.tgt_out[row].tolist() == t + [EOS_ID] + [PAD_ID] * (b.tgt_out.size(1) - len(t) - 1)
        assert torch.equal(b.tgt_in[row, 1 : len(t) + 1], b.tgt_out[row, : len(t)])  # labels = input shifted left
