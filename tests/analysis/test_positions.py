"""The position vectors analysis reads from a model: section 3.5's formula, or the learned table."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from transformer_mt.analysis import position_table


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_sinusoid_positions_are_section_3_5s(layout: str):
    model = tiny_model(positions="sinusoidal", position_layout=layout)  # d_model 32
    table = position_table(model, 20)
    assert table.shape == (20, 32) and table.dtype == torch.float32 and table.device.type == "cpu"
    pos = torch.arange(20, dtype=torch.float64)[:, None]  # (20, 1)
    angle = pos / 10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32)  # (20, 16): pos / 10000^(2i/d)
    sin, cos = angle.sin(), angle.cos()
    # interleaved: sin at even dimensions, cos at odd; halves: every sine, then every cosine
    expected = torch.stack([sin, cos], dim=2).reshape(20, 32) if layout == "interleaved" else torch.cat([sin, cos], 1)
    torch.testing.assert_close(table.double(), expected, atol=1e-6, rtol=0)


def test_learned_positions_are_the_models_rows():
    model = tiny_model(positions="learned")
    with torch.no_grad():
        model.pos_embed.weight.copy_(torch.arange(64 * 32, dtype=torch.float32).view(64, 32))
    table = position_table(model, 10)
    assert not table.requires_grad
    assert torch.equal(table, torch.arange(10 * 32, dtype=torch.float32).view(10, 32))
