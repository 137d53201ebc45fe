"""flops.py: the analytic counts against torch's own FLOP counter on the real modules; the peak cache."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from tests.conftest import tiny_model
from transformer_mt.config import ModelConfig
from transformer_mt.data import collate
from transformer_mt.runtime import flops

VOCAB = 50
CONFIGS = {
    "plain": ModelConfig(encoder_layers=2, decoder_layers=3, d_model=16, heads=4, d_ff=24, dropout=0.0),
    # d_k != d_v != d_model / h (Table 3 row B), post-norm, separate embeddings
    "row_b": ModelConfig(
        encoder_layers=1,
        decoder_layers=2,
        d_model=12,
        heads=2,
        head_dim=5,
        value_dim=7,
        d_ff=20,
        dropout=0.0,
        norm="pre",
        share_all_embeddings=False,
        share_decoder_embeddings=False,
    ),
}


def counted(fn) -> int:
    """FLOPs torch's FlopCounterMode sees; CPU flash attention gets the CUDA kernel's formula (torch has none for
    it)."""
    aten = torch.ops.aten
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = lambda q, k, v, *a, out_shape=None, **kw: (
            sdpa_flop_count(q, k, v)
        )
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_flops_equal_torch_count(name):
    model = tiny_model(VOCAB, config=CONFIGS[name])
    batch = collate([([5, 6, 7, 8, 9, 10], [11, 12, 13]), ([5, 6], [7, 8, 9, 10, 11, 12, 13])])  # padded both sides
    with torch.inference_mode():
        measured = counted(lambda: model(batch.src, batch.tgt_in))
    b, s = batch.src.shape
    analytic = flops.forward_flops(model.cfg, vocab=VOCAB, batch=b, src_len=s, tgt_len=batch.tgt_in.size(1))
    assert analytic == measured
    assert flops.train_flops(model.cfg, vocab=VOCAB, batch=b, src_len=s, tgt_len=batch.tgt_in.size(1)) == 3 * measured


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("beam", [1, 3])
def test_decode_flops_equal_torch_count_of_cached_decoding(name, beam):
    model = tiny_model(VOCAB, config=CONFIGS[name])
    src = torch.tensor([[4, 5, 6, 7, 8, 3]])  # (1, S)
    steps = 5

    def run() -> None:  # what search does for one sentence whose beams all live to the end
        cache = model.init_cache(model.encode(src))
        cache.reorder(torch.zeros(beam, dtype=torch.long))  # beam rows share one copy of the source side
        tokens = torch.full((beam,), 2)
        for _ in range(steps):
            tokens = model.decode_step(tokens, cache).argmax(-1)

    with torch.inference_mode():
        measured = counted(run)
    assert flops.decode_flops(model.cfg, vocab=VOCAB, src_len=src.size(1), tgt_len=steps, beam=beam) == measured
    per = flops.per_target_token(model.cfg, vocab=VOCAB, src_len=src.size(1), tgt_len=steps, beam=beam)
    assert per["decode"] == pytest.approx(measured / steps)


def test_paper_base_forward_flops_by_hand():
    """Base model, one 10-token source, 10-token target, 37k vocabulary: the formula written out."""
    m = ModelConfig()  # base: 6+6, d 512, h 8, dk = dv = 64, d_ff 2048
    d, f, n, v = 512, 2048, 10, 37000
    layer = 2 * n * d * 3 * d + 2 * n * d * d + 2 * n * n * 2 * d + 4 * n * d * f  # projections, attention, FFN
    cross = 2 * n * d * d + 2 * n * d * 2 * d + 2 * n * d * d + 2 * n * n * 2 * d
    assert (
        flops.forward_flops(m, vocab=v, batch=1, src_len=n, tgt_len=n)
        == 6 * layer + 6 * (layer + cross) + 2 * n * d * v
    )


def test_training_cost_totals_and_mfu():
    m = CONFIGS["plain"]
    b1 = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])])  # src (2, 4), tgt (2, 5)
    b2 = collate([([5, 6], [8])])  # src (1, 3), tgt (1, 2)
    total = flops.batches_train_flops(m, [b1, b2], vocab=VOCAB)
    by_batch = (
        flops.forward_flops(m, vocab=VOCAB, batch=2, src_len=4, tgt_len=5),
        flops.forward_flops(m, vocab=VOCAB, batch=1, src_len=3, tgt_len=2),
    )
    assert total == 3 * sum(by_batch)
    s = flops.cost_summary(
        tokens=10,
        train_flops=total,
        update_seconds=3.0,
        wall_seconds=6.0,
        peak_flops_per_s=1e6,
        peak_source="config",
        world_size=2,
    )
    assert s["flops_per_token"] == pytest.approx(total / 10) and s["update_seconds"] == 3.0
    assert s["mfu"] == pytest.approx(total / 3.0 / 2e6) and s["mfu_wall"] == pytest.approx(total / 6.0 / 2e6)
    assert s["achieved_tflops"] == pytest.approx(total / 3.0 / 1e12) and s["peak_tflops"] == pytest.approx(2e-6)
    assert json.loads(json.dumps(s)) == s  # plain types for metrics.jsonl
    line = flops.format_cost(s, tokens=10, wall_seconds=6.0)
    assert "10 target tokens" in line and "MFU" in line and "\n" not in line


def test_peak_measured_once_then_read_from_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TMT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(flops.PEAK_N, "cpu", 128)
    calls = []
    real = flops.measure_peak

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(flops, "measure_peak", counted)
    first = flops.cached_peak("float32", device="cpu")
    assert first > 0 and len(calls) == 1
    table = json.loads((tmp_path / "peak.json").read_text())
    key = flops.peak_key("float32", torch.device("cpu"))
    assert key in table and f"|{torch.get_num_threads()} threads" in key
    assert flops.cached_peak("float32", device="cpu") == first and len(calls) == 1  # no second measurement
    (tmp_path / "peak.json").write_text("{not json")
    assert flops.cached_peak("float32", device="cpu") > 0 and len(calls) == 2  # a damaged cache is measured again
    assert flops.peak_for("float32", device="cpu", peak_tflops=2.5) == (2.5e12, "config")
