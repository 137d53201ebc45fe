"""The static decoder cache: key/value buffers preallocated to the longest output, written in place at the step's
position, attention masked to the filled prefix. Expectations come from the growing cache (``DecoderCache``), whose
steps attend over exactly the filled prefix without a mask."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model import choose_ops

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("rows", [3, 40])  # below and above the cpu backend's spelled-out step (32 rows)
def test_step_attention_masked_to_a_prefix_equals_the_prefix_alone(backend: str, rows: int) -> None:
    """A step over T = 9 positions of which the first 4 are filled (the rest stale, here large but finite) and masked
    off attends exactly as a step over the 4 filled positions alone."""
    ops = choose_ops(backend)
    g = torch.Generator().manual_seed(0)
    heads, dk, dv, filled, total = 4, 8, 6, 4, 9
    q = torch.randn(rows, heads, 1, dk, generator=g)
    k = torch.randn(rows, heads, total, dk, generator=g) * 50.0  # stale positions would dominate unmasked
    v = torch.randn(rows, heads, total, dv, generator=g) * 50.0
    allowed = (torch.arange(total) < filled).view(1, 1, 1, total)
    with torch.inference_mode():
        masked = ops.self_attention_step(q, k, v, dropout_p=0.0, allowed=allowed)
        prefix = ops.self_attention_step(q, k[:, :, :filled], v[:, :, :filled], dropout_p=0.0)
        unmasked = ops.self_attention_step(q, k, v, dropout_p=0.0)
    assert masked.shape == (rows, 1, heads * dv)
    torch.testing.assert_close(masked, prefix, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(unmasked, prefix, atol=1e-3)  # the mask is what makes them equal
