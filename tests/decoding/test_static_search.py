"""Greedy and beam search on a static cache (``static_cache=True``) against the growing cache, on the tiny trained
checkpoint and real Multi30k validation sentences of unequal lengths: the same hypotheses, scores within 1e-5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import head
from transformer_mt.data import source_tensor
from transformer_mt.decoding import Hypothesis, SearchError, beam_search, greedy_search_batches, model_from_checkpoint
from transformer_mt.model import Ensemble, Transformer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tiny_run, corpus_slice) -> tuple[Transformer, list[torch.Tensor]]:
    """The tiny trained model and 20 real validation sources in batches of 7, 9 and 4 (each (B, S), padded)."""
    ck = model_from_checkpoint(tiny_run.checkpoint)
    ids = ck.src_tok.encode(head(corpus_slice["val.en"], 20))
    batches = [source_tensor(ids[a:b]) for a, b in ((0, 7), (7, 16), (16, 20))]
    assert all(bool((src == ck.model.specials.pad).any()) for src in batches)  # every batch has padding
    return ck.model.eval(), batches


def assert_same(found: list[list[Hypothesis]], expected: list[list[Hypothesis]]) -> None:
    """The same hypotheses, in the same order, their scores and log-probs within 1e-5, or 1e-6 of their size: a
    float32 sum of 85 log-probs near -74 is 2 ulps (1.5e-5) off after the keys are summed in another order."""
    assert [[h.tokens for h in nb] for nb in found] == [[h.tokens for h in nb] for nb in expected]
    for nb, want in zip(found, expected):
        for h, w in zip(nb, want):
            assert h.score == pytest.approx(w.score, rel=1e-6, abs=1e-5)
            assert h.logprob == pytest.approx(w.logprob, rel=1e-6, abs=1e-5)


def test_greedy_on_a_static_cache_gives_the_growing_caches_hypotheses(trained) -> None:
    model, batches = trained
    growing = greedy_search_batches(model, batches, batch_tokens=400)  # carries a batch's last rows along
    static = greedy_search_batches(model, batches, batch_tokens=400, static_cache=True)
    assert sum(len(h.tokens) for hyps in growing for h in hyps) > 100  # real translations, not empty ones
    for found, expected in zip(static, growing):
        assert_same([[h] for h in found], [[h] for h in expected])


@pytest.mark.parametrize("beam", [4, 5])
def test_beam_on_a_static_cache_gives_the_growing_caches_nbest(trained, beam: int) -> None:
    model, batches = trained
    for src in batches:
        growing = beam_search(model, src, beam=beam, nbest=beam, lenpen=0.6)
        static = beam_search(model, src, beam=beam, nbest=beam, lenpen=0.6, static_cache=True)
        assert all(len(nb) == beam for nb in growing)
        assert_same(static, growing)


def test_an_ensemble_on_static_caches_gives_its_growing_caches_hypotheses(trained, tiny_run) -> None:
    """The tiny run's checkpoints of updates 75 and 150, decoded as one ensemble."""
    model, batches = trained
    early = model_from_checkpoint(Path(tiny_run.run_dir) / "checkpoint_75.pt").model.eval()
    ensemble = Ensemble([early, model]).eval()
    growing = greedy_search_batches(ensemble, batches[:2])
    static = greedy_search_batches(ensemble, batches[:2], static_cache=True)
    for found, expected in zip(static, growing):
        assert_same([[h] for h in found], [[h] for h in expected])
    assert_same(
        beam_search(ensemble, batches[2], beam=4, nbest=2, static_cache=True),
        beam_search(ensemble, batches[2], beam=4, nbest=2),
    )


def test_a_static_cache_needs_a_transformer_or_an_ensemble(trained) -> None:
    model, batches = trained

    class Wrapped:  # a search model of its own: the protocol, no static cache
        def __init__(self, inner: Transformer):
            self.inner, self.training, self.specials = inner, False, inner.specials

        def encode(self, src):
            return self.inner.encode(src)

        def init_cache(self, enc):
            return self.inner.init_cache(enc)

        def decode_step(self, tokens, cache):
            return self.inner.decode_step(tokens, cache)

        def max_output_length(self):
            return self.inner.max_output_length()

    assert greedy_search_batches(Wrapped(model), batches[:1]) == greedy_search_batches(model, batches[:1])
    with pytest.raises(SearchError, match="static_cache needs a Transformer or an Ensemble"):
        greedy_search_batches(Wrapped(model), batches[:1], static_cache=True)
