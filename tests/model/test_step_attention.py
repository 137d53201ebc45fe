"""The cpu backend spells a decoding step's attention out over many rows (``CpuOps.step_spelled_out_rows``):
self-attention over the cache's time-major buffers, cross-attention as batched matmuls. Expectations from the
reference backend (SDPA) on the same trained model and real Multi30k lines: the same logits step by step (after beam
reorders, with source padding), and the same translations."""

from __future__ import annotations

import pytest
import torch

import transformer_mt.model.ops.cpu.generic as cpu_generic
from tests.conftest import head
from transformer_mt.data import source_tensor
from transformer_mt.decoding import model_from_checkpoint, search
from transformer_mt.model import choose_ops

pytestmark = pytest.mark.usefixtures("one_thread")
BEAM = 3


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, corpus_slice):
    """The tiny trained checkpoint's model, 10 real validation sources (B, S) padded, and their references' ids."""
    ck = model_from_checkpoint(tiny_checkpoint)
    src = source_tensor(ck.src_tok.encode(head(corpus_slice["val.en"], 10)))
    refs = ck.tgt_tok.encode(head(corpus_slice["val.de"], 10))
    return ck.model.eval(), src, refs


def _spelled(monkeypatch, model, on: bool) -> list[str]:
    """The cpu backend spelling every step's attention out (on), or the reference backend's SDPA; returns the list the
    spelled-out calls are noted in."""
    calls: list[str] = []
    if not on:
        model.use_ops(choose_ops("reference"))
        return calls
    ops = choose_ops("cpu")
    monkeypatch.setattr(ops, "step_spelled_out_rows", 1)

    def noting(name: str, original):
        def noted(*args):
            calls.append(name)
            return original(*args)

        return noted

    for name in ("step_self_attention", "step_cross_attention"):
        monkeypatch.setattr(cpu_generic, name, noting(name, getattr(cpu_generic, name)))
    model.use_ops(ops)
    return calls


def _steps(model, src: torch.Tensor, refs: list[list[int]]) -> list[torch.Tensor]:
    """Decode the references (BEAM rows per sentence, each beam's rows shuffled at every step) -> logits per step."""
    b, steps = src.size(0), 6
    tgt = torch.full((b, steps), model.specials.eos)
    for i, ref in enumerate(refs):
        tgt[i, : min(steps, len(ref))] = torch.tensor(ref[:steps])
    with torch.inference_mode():
        cache = model.init_cache(model.encode(src))
        cache.reorder(torch.arange(b).repeat_interleave(BEAM), group=BEAM)  # B -> B*BEAM rows
        tokens, out = torch.full((b * BEAM,), model.specials.start), []
        for step in range(steps):
            out.append(model.decode_step(tokens, cache))  # (B*BEAM, V)
            rows = torch.arange(b * BEAM).view(b, BEAM)  # (B, BEAM)
            rows = (
                rows.flip(1) if step % 2 else torch.cat([rows[:, 1:], rows[:, :1]], dim=1)
            )  # each sentence's beams reordered
            cache.reorder(rows.flatten(), group=BEAM)
            tokens = tgt[:, step].repeat_interleave(BEAM)
    return out


def test_spelled_out_step_attention_gives_the_sdpa_logits(trained, monkeypatch):
    model, src, refs = trained
    assert src.eq(model.specials.pad).any()  # some sources are padded: the cross-attention mask is in play
    _spelled(monkeypatch, model, False)
    want = _steps(model, src, refs)
    calls = _spelled(monkeypatch, model, True)
    got = _steps(model, src, refs)
    assert "step_self_attention" in calls and "step_cross_attention" in calls
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_spelled_out_step_attention_translates_as_sdpa_does(trained, monkeypatch, beam):
    model, src, _ = trained
    _spelled(monkeypatch, model, False)
    want = search(model, src, beam=beam, lenpen=0.6, nbest=beam, max_len_a=1.2, max_len_b=5)
    calls = _spelled(monkeypatch, model, True)
    got = search(model, src, beam=beam, lenpen=0.6, nbest=beam, max_len_a=1.2, max_len_b=5)
    assert calls
    assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want]
    for g, w in zip(got, want):
        torch.testing.assert_close([h.score for h in g], [h.score for h in w], rtol=0, atol=1e-5)
