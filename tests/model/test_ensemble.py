"""Ensemble decoding: each step's scores against the members' own full teacher-forced passes, and
beam search over an ensemble of one model twice against that model alone."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_model, tokens
from transformer_mt.decoding import beam_search, greedy_search, greedy_search_batches
from transformer_mt.model import Ensemble

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_scores_are_the_log_of_the_members_mean_probability_through_reorders():
    a, b = tiny_model(seed=0), tiny_model(seed=1, positions="learned", max_positions=32)
    ens = Ensemble([a, b]).eval()
    src = tokens([5, 3, 4], seed=2)  # (3, 5)
    tgt_in = tokens([6, 6, 6], bos=True, seed=3)  # (3, 6): BOS + 5 tokens
    with torch.no_grad():
        # Independent computation: each member's full forward, probabilities averaged in float64.
        probs = [torch.softmax(m(src, tgt_in).double(), dim=-1) for m in (a, b)]  # 2 x (3, 6, V)
        expected = torch.log((probs[0] + probs[1]) / 2)  # (3, 6, V)
        cache = ens.init_cache(ens.encode(src))
        rows = torch.arange(3)  # sentence held by each cache row
        for step in range(tgt_in.size(1)):
            if step == 2:  # expand to two beams per sentence and shuffle them, as beam search does
                cache.reorder(torch.tensor([2, 2, 0, 1, 1, 0]))
                rows = torch.tensor([2, 2, 0, 1, 1, 0])
            if step == 4:  # drop a finished sentence
                cache.reorder(torch.tensor([0, 1, 4, 5]))
                rows = rows[torch.tensor([0, 1, 4, 5])]
            got = ens.decode_step(tgt_in[rows, step], cache)  # (rows, V)
            torch.testing.assert_close(got.double(), expected[rows, step], atol=1e-5, rtol=1e-5)
            assert torch.allclose(got.exp().sum(-1), torch.ones(len(rows)), atol=1e-5)  # a distribution


def test_an_ensemble_of_one_model_twice_searches_like_the_model():
    model = tiny_model(seed=4)
    ens = Ensemble([model, model]).eval()
    src = tokens([7, 4, 6, 2], seed=5)
    assert [h.tokens for h in greedy_search(model, src)] == [h.tokens for h in greedy_search(ens, src)]
    alone, both = beam_search(model, src, beam=3, nbest=3), beam_search(ens, src, beam=3, nbest=3)
    assert [[h.tokens for h in n] for n in alone] == [[h.tokens for h in n] for n in both]
    for n_alone, n_both in zip(alone, both):
        for h1, h2 in zip(n_alone, n_both):
            assert math.isclose(h1.score, h2.score, abs_tol=1e-4)


def test_an_ensembles_batches_join_as_the_models_do(monkeypatch):
    model = tiny_model(seed=4)
    ens = Ensemble([model, model]).eval()
    srcs = [tokens([9, 8, 8], seed=6), tokens([5, 4, 4, 3], seed=7), tokens([2, 2], seed=8)]  # (B, S), longest first
    alone = [greedy_search(model, src, max_len_b=6) for src in srcs]
    steps: list[int] = []
    plain = Ensemble.decode_step

    def noted(self, tok, cache):
        steps.append(tok.size(0))
        return plain(self, tok, cache)

    monkeypatch.setattr(Ensemble, "decode_step", noted)
    together = greedy_search_batches(ens, srcs, max_len_b=6, batch_tokens=10**6)  # every batch joins the next
    assert max(steps) > max(src.size(0) for src in srcs)  # rows of two batches in one step
    assert [[h.tokens for h in hyps] for hyps in together] == [[h.tokens for h in hyps] for hyps in alone]


def test_output_limit_is_the_shortest_members():
    assert Ensemble([tiny_model(), tiny_model(positions="learned", max_positions=16)]).max_output_length() == 16
    assert Ensemble([tiny_model(), tiny_model()]).max_output_length() is None  # sinusoids extend to any length
