"""LoRA adapters (model/lora.py): an adapted model starts as its base, its merged weights compute what it computes,
only the adapters train and their count is r (in + out) per adapted projection."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model, tiny_model_config, tokens
from transformer_mt.config import LoraConfig, ModelConfig
from transformer_mt.model import Transformer, add_lora, choose_ops, is_adapter_name, merge_lora_weights

pytestmark = pytest.mark.usefixtures("one_thread")

ALL = ["q", "k", "v", "o", "ffn1", "ffn2"]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return tokens([7, 5, 3]), tokens([6, 4, 5], bos=True, seed=2)


def _adapted(cfg: ModelConfig, lora: LoraConfig, *, ops: str = "reference") -> Transformer:
    """A tiny model with adapters whose B is random (a trained adapter's), so that they change the outputs."""
    model = tiny_model(config=cfg).use_ops(choose_ops(ops))
    add_lora(model, lora)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def test_an_adapted_model_starts_exactly_as_its_base():
    src, tgt = _batch()
    base = tiny_model()
    expected = base(src, tgt)
    add_lora(base, LoraConfig(rank=4, targets=ALL))
    assert torch.equal(base(src, tgt), expected)  # B = 0: the low-rank path adds exact zeros


@pytest.mark.parametrize("ops", ["reference", "cpu"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_merged_weights_compute_what_the_adapted_model_computes(ops, norm):
    cfg = tiny_model_config(norm=norm, head_dim=4, value_dim=12)  # q/k rows differ from v rows: the fused slices
    lora = LoraConfig(rank=3, alpha=6.0, targets=ALL)
    model = _adapted(cfg, lora, ops=ops)
    src, tgt = _batch()
    with torch.no_grad():
        adapted = model(src, tgt)
        assert (adapted - tiny_model(config=cfg)(src, tgt)).abs().max() > 1e-2  # the adapters do change the logits
        merged_weights = merge_lora_weights(model.state_dict(), cfg, lora)
        assert not any(is_adapter_name(name) for name in merged_weights)
        merged = tiny_model(config=cfg).use_ops(choose_ops(ops))
        merged.load_state_dict(merged_weights)  # strict: exactly a plain model's tensors
        torch.testing.assert_close(merged(src, tgt), adapted, atol=1e-5, rtol=0)
        # incremental decoding goes through project_q / project_kv: the same numbers step by step
        enc = model.encode(src)
        cache = model.init_cache(enc)
        for t in range(tgt.size(1)):
            step = model.decode_step(tgt[:, t], cache)
            torch.testing.assert_close(step, adapted[:, t], atol=1e-5, rtol=0)


def _adapted_shapes(cfg: ModelConfig, targets: list[str]) -> list[tuple[int, int]]:
    """(in, out) of every adapted projection, from the architecture's definition (section 3.2.2, 3.3)."""
    d, h = cfg.d_model, cfg.heads
    dk, dv = cfg.head_dim or d // h, cfg.value_dim or d // h
    per_attention = {"q": (d, h * dk), "k": (d, h * dk), "v": (d, h * dv), "o": (h * dv, d)}
    per_ffn = {"ffn1": (d, cfg.d_ff), "ffn2": (cfg.d_ff, d)}
    attentions = cfg.encoder_layers + 2 * cfg.decoder_layers  # self-attention in both stacks, cross in the decoder
    ffns = cfg.encoder_layers + cfg.decoder_layers
    return [per_attention[t] for t in targets if t in per_attention] * attentions + [
        per_ffn[t] for t in targets if t in per_ffn
    ] * ffns


@pytest.mark.parametrize("targets", [["q", "v"], ["k", "o"], ["ffn1"], ALL])
@pytest.mark.parametrize("rank", [1, 4])
def test_the_trained_parameters_are_r_times_in_plus_out_per_adapted_projection(targets, rank):
    cfg = tiny_model_config(encoder_layers=3, decoder_layers=2, head_dim=4, value_dim=12, d_ff=48)
    model = add_lora(tiny_model(config=cfg), LoraConfig(rank=rank, targets=targets))
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    assert all(is_adapter_name(name) for name, _ in trained)
    assert sum(p.numel() for _, p in trained) == sum(rank * (i + o) for i, o in _adapted_shapes(cfg, targets))


def test_only_the_adapters_get_gradients_and_the_base_keeps_its_dtype():
    model = add_lora(tiny_model().train(), LoraConfig(rank=2, targets=["q", "ffn2"], dropout=0.1))
    src, tgt = _batch()
    model(src, tgt).sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == is_adapter_name(name), name
        assert p.dtype == torch.float32
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    # B starts at zero: the first gradient reaches B only (A's is B^T times the output's, exactly zero)
    assert all(g.abs().sum() > 0 for name, g in grads.items() if name.endswith(".B"))
    assert all(torch.count_nonzero(g) == 0 for name, g in grads.items() if name.endswith(".A"))


@pytest.mark.parametrize("ops", ["reference", "cpu"])
def test_packed_training_gives_the_padded_loss_and_adapter_gradients(ops):
    """train.packed runs the adapters through the same projections: loss and every adapter's gradient as padded."""
    from transformer_mt.data import collate, pack
    from transformer_mt.model import Packing, Segments, TeacherForcedLoss

    model = _adapted(tiny_model_config(), LoraConfig(rank=2, targets=ALL), ops=ops).train()
    g = torch.Generator().manual_seed(3)
    lengths = [(5, 7), (9, 4), (3, 3), (8, 6)]
    pairs = [
        (torch.randint(4, 40, (s,), generator=g).tolist(), torch.randint(4, 40, (t,), generator=g).tolist())
        for s, t in lengths
    ]
    batch = collate(pairs)
    p = pack(batch, pad=0)
    packing = Packing(
        Segments(p.src_cu_seqlens, p.src_max_len, p.src_positions),
        Segments(p.tgt_cu_seqlens, p.tgt_max_len, p.tgt_positions),
    )
    results = []
    for args, kwargs in (
        ((batch.src, batch.tgt_in, batch.tgt_out), {}),
        ((p.src, p.tgt_in, p.tgt_out), {"packing": packing}),
    ):
        model.zero_grad(set_to_none=True)
        loss, _, _ = TeacherForcedLoss(model, label_smoothing=0.1)(*args, **kwargs)
        loss.backward()
        results.append((loss.detach(), {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}))
    (padded, padded_grads), (packed, packed_grads) = results
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=0)
    assert padded_grads.keys() == packed_grads.keys() and all(is_adapter_name(n) for n in padded_grads)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=1e-5 * float(grad.abs().max()) + 1e-8)
