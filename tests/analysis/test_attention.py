"""The attention maps of analysis: padding invariance of a batch's weights (their values against an independent
computation are checked through `tmt attention`, in tests/viz)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer_mt.analysis import batch_attention
from transformer_mt.decoding import Translator


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, device="cpu")


def test_attention_padding_gets_zero_weight_and_changes_nothing(translator: Translator):
    model, tok = translator.model, translator.src_tok
    long, short = tok.encode(["A man in a blue shirt is standing on a ladder.", "Two dogs."])
    tgt_long, tgt_short = tok.encode(["Ein Mann in einem blauen Hemd steht auf einer Leiter.", "Zwei Hunde."])
    enc, dec, cross, src, tgt_in = batch_attention(model, [long, short], [tgt_long, tgt_short])
    s, t = len(short) + 1, len(tgt_short) + 1  # the short pair's real lengths (EOS / BOS included)
    assert src.size(1) > s and tgt_in.size(1) > t  # it is padded
    # padded source keys get exactly 0
    assert bool((cross[1, ..., s:] == 0).all()) and bool((enc[1, ..., s:] == 0).all())
    assert bool((dec[1, :, :, :t, t:] == 0).all())  # a real target position never sees padding (it lies in its future)
    alone = batch_attention(model, [short], [tgt_short])
    for batched, single, (q, k) in zip((enc, dec, cross), alone[:3], ((s, s), (t, t), (t, s))):
        torch.testing.assert_close(batched[1, :, :, :q, :k], single[0], atol=1e-5, rtol=0)
