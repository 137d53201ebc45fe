"""The shapes analysis records while a batch runs through the real modules, against shapes from first principles."""

from __future__ import annotations

import torch

from tests.conftest import tiny_model, tokens
from transformer_mt.analysis import describe, traced
from transformer_mt.model import MultiHeadAttention


def test_traced_records_each_attentions_shapes_and_restores_the_modules():
    model = tiny_model()  # 2 + 2 layers, d_model 32, 4 heads: Dk = Dv = 8; vocabulary 40
    src, tgt_in = tokens([7, 4]), tokens([5, 3], bos=True, seed=2)  # (B=2, S=7), (B=2, T=5), second rows padded
    with traced(model) as (calls, details), torch.no_grad():
        model.decode(tgt_in, model.encode(src))
    assert "Q (B, H, S, Dk) = (2, 4, 7, 8)   K (B, H, S, Dk) = (2, 4, 7, 8)" in details["encoder.1.self_attn"][0]
    assert "(B, H, T, T) = (2, 4, 5, 5)" in details["decoder.0.self_attn"][1]
    assert "(B, H, T, S) = (2, 4, 5, 7)" in details["decoder.1.cross_attn"][1]
    assert details["decoder.1.cross_attn"][2] == "heads concatenated (B, T, H*Dv) = (2, 5, 32) -> out"
    assert calls["encoder.0.ffn"] == ["(2, 7, 32) -> (2, 7, 32)"]  # (B, S, D) -> (B, S, D)
    assert "(2, 5, 32) -> (2, 5, 40)" in [c for shapes in calls.values() for c in shapes]  # the logits
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attention) == 6 and all("attend" not in vars(m) for m in attention)  # the class's method again
    with traced(model) as (calls, details):
        pass
    assert not calls and not any(details.values())  # nothing ran: nothing recorded


def test_describe_names_the_sizes():
    model = tiny_model()
    assert describe(model.encoder[0].self_attn) == "MultiHeadAttention(4 heads, d_k 8, d_v 8)"
    assert describe(model.encoder[0].ffn.fc1) == "Linear(32 -> 64)"
    assert describe(model.encoder) == "ModuleList x2"
    assert describe(torch.nn.Linear(3, 2, bias=False)) == "Linear(3 -> 2, no bias)"
