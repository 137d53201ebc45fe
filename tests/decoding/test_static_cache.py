"""The static decoder cache: key/value buffers preallocated to the longest output, written in place at the step's
position, attention masked to the filled prefix. Expectations come from the growing cache (``DecoderCache``), whose
steps attend over exactly the filled prefix without a mask."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model, tokens
from transformer_mt.model import choose_ops
from transformer_mt.runtime import SyncCounter

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


def _side_by_side(model, src: torch.Tensor, *, beam: int, steps: int, max_len: int) -> list[float]:
    """Decode ``src`` with a growing and a static cache side by side, through the searches' reorders: rows expanded to
    ``beam`` beams, each step's beams following random beams of their sentence, the first sentence dropped after step
    2. Returns the largest logit difference of each step."""
    groups, gaps = src.size(0), []
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        enc = model.encode(src)
        growing, static = model.init_cache(enc), model.init_static_cache(enc, max_len=max_len)
        for cache in (growing, static):
            cache.reorder(torch.arange(groups).repeat_interleave(beam), group=beam)
        tokens = torch.full((groups * beam,), model.specials.start)
        for step in range(steps):
            a, b = model.decode_step(tokens, growing), model.decode_step(tokens, static)
            assert torch.equal(a.isinf(), b.isinf())  # a restricted output's -inf at the same ids
            gaps.append(float((a - b).nan_to_num(0.0).abs().max()))
            drop = step == 2 and groups > 1
            kept = torch.arange(1, groups) if drop else None
            groups -= drop
            first_rows = (torch.arange(groups) + drop) * beam  # (G',) the first old row of each kept sentence
            indices = first_rows.repeat_interleave(beam) + torch.randint(beam, (groups * beam,), generator=g)
            for cache in (growing, static):
                cache.reorder(indices, group=beam, kept=kept)
            tokens = a.argmax(-1).index_select(0, indices)
    return gaps


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("beam", [1, 3])
def test_static_steps_give_the_growing_caches_logits(norm: str, beam: int) -> None:
    """Step by step, through beam expansion, reshuffles and a dropped sentence, with source padding: the static
    cache's logits are the growing cache's up to float rounding."""
    model = tiny_model(norm=norm)
    gaps = _side_by_side(model, tokens([5, 9, 3]), beam=beam, steps=7, max_len=12)
    assert max(gaps) < 1e-5, gaps


def test_static_steps_with_learned_positions_and_restricted_output() -> None:
    model = tiny_model(positions="learned", restrict_output=True)
    model.restrict_output_to(torch.arange(4, 30))
    gaps = _side_by_side(model, tokens([4, 6]), beam=2, steps=5, max_len=8)
    assert max(gaps) < 1e-5, gaps


def test_reorder_keeps_the_buffers_addresses() -> None:
    """A captured step reads fixed addresses: beam expansion, reshuffles and dropped sentences copy rows within the
    buffers, never into new ones."""
    model = tiny_model()
    with torch.inference_mode():
        cache = model.init_static_cache(model.encode(tokens([5, 9, 3])), max_len=10)
        cache.reorder(torch.arange(3).repeat_interleave(2), group=2)
        model.decode_step(torch.full((6,), model.specials.start), cache)  # allocates the self-attention K/V
        b = cache.buffers
        assert b.keys is not None and b.values is not None
        before = [t.data_ptr() for t in (b.keys, b.values, b.cross_k, b.cross_v, b.position, b.self_allowed)]
        cache.reorder(torch.tensor([1, 1, 4, 5, 2, 2]), group=2)
        model.decode_step(torch.full((6,), 5), cache)
        cache.reorder(torch.tensor([4, 5]), group=2, kept=torch.tensor([2]))
        model.decode_step(torch.full((2,), 5), cache)
        after = [t.data_ptr() for t in (b.keys, b.values, b.cross_k, b.cross_v, b.position, b.self_allowed)]
        assert (cache.rows, cache.groups, cache.length, int(b.position)) == (2, 1, 3, 3)
    assert after == before


def test_a_static_step_reads_nothing_back_from_the_device() -> None:
    """What makes it capturable: no host sync in decode_step (the growing cache has none either; its shapes change)."""
    model = tiny_model()
    with torch.inference_mode():
        cache = model.init_static_cache(model.encode(tokens([5, 9, 3])), max_len=10)
        step = torch.full((3,), model.specials.start)
        model.decode_step(step, cache)
        with SyncCounter() as syncs:
            for _ in range(3):
                model.decode_step(step, cache)
    assert syncs.total == 0, syncs.sites


def test_a_static_cache_longer_than_the_position_table_is_refused() -> None:
    model = tiny_model(positions="learned")  # 64 learned positions
    with torch.inference_mode(), pytest.raises(ValueError, match="max_positions=64"):
        model.init_static_cache(model.encode(tokens([5])), max_len=65)
