"""The Translator's static-buffer search (GraphedStep): off by default on a CPU, and when asked for there (its
eager replay form, the same buffers, buckets and copies a GPU captures), the same translations and scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import head
from transformer_mt.decoding import Translator


@pytest.fixture(scope="module")
def lines(multi30k: Path) -> list[str]:
    return head(multi30k / "test_2016_flickr.en", 40)


def test_a_cpu_translator_keeps_the_growing_cache(tiny_checkpoint: Path) -> None:
    assert Translator.from_checkpoint(tiny_checkpoint, device="cpu").graphs is None


@pytest.mark.parametrize("beam", [1, 4])
def test_graphed_search_translates_as_the_growing_cache(tiny_checkpoint: Path, lines: list[str], beam: int) -> None:
    plain = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    graphed = Translator.from_checkpoint(tiny_checkpoint, device="cpu", graphs=True)
    assert graphed.graphs is not None
    want = plain.translate_batch(lines, beam=beam, lenpen=0.6, nbest=min(beam, 2)).hypotheses
    got = graphed.translate_batch(lines, beam=beam, lenpen=0.6, nbest=min(beam, 2)).hypotheses
    assert [[t for _, t in nb] for nb in got] == [[t for _, t in nb] for nb in want]
    for g, w in zip(got, want):
        for (gs, _), (ws, _) in zip(g, w):
            assert gs == pytest.approx(ws, rel=1e-6, abs=1e-5)
    stats = graphed.graphs.stats
    assert stats.eager_replays > 0  # the search ran its steps on the shared buffers (a CPU replays them eagerly)
    assert stats.eager_batches == 0  # every batch fitted the buckets, none ran on a cache of its own
