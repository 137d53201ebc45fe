"""What a LoRA step holds besides activations, on a scaled-down NLLB shape (d_model 256, 6+6 layers, d_ff 1024,
8000 pieces): weights, gradients and Adam's two moments, counted tensor by tensor after one real update (the
optimizer tmt builds, its state as torch keeps it), against a full fine-tuning step of the same model."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tokens
from transformer_mt.config import LoraConfig, ModelConfig, TrainConfig
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.training import build_optimizer, prepare_for_training

pytestmark = pytest.mark.usefixtures("one_thread")

NLLB_SMALL = ModelConfig(encoder_layers=6, decoder_layers=6, d_model=256, heads=4, d_ff=1024, dropout=0.0, norm="pre")
VOCAB = 8000


def _state_bytes(lora: LoraConfig) -> tuple[int, int]:
    """(bytes of weights + gradients + optimizer state after one update, numbers that trained)."""
    torch.manual_seed(0)
    model = Transformer(NLLB_SMALL, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    t = TrainConfig(lora=lora)
    prepare_for_training(model, t)
    optimizer = build_optimizer(model, t)
    src, tgt = tokens([12, 9, 7, 12], vocab=VOCAB), tokens([11, 12, 6, 9], bos=True, seed=2, vocab=VOCAB)
    tgt_out = torch.cat([tgt[:, 1:], torch.full((tgt.size(0), 1), 3)], dim=1)
    loss_fn = TeacherForcedLoss(model, label_smoothing=0.1)
    loss_sum, _, _ = loss_fn(src, tgt, tgt_out)
    loss_sum.backward()
    optimizer.step()
    params = list(model.parameters())
    held = sum(p.nbytes for p in params) + sum(p.grad.nbytes for p in params if p.grad is not None)
    held += sum(v.nbytes for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return held, sum(p.numel() for p in params if p.requires_grad)


def test_a_lora_step_holds_a_fraction_of_a_full_step():
    full, full_trained = _state_bytes(LoraConfig())
    lora, lora_trained = _state_bytes(LoraConfig(rank=8, targets=["q", "v"]))
    total = full_trained  # every parameter trains in the full step
    # full: fp32 weight, gradient, exp_avg, exp_avg_sq per number (+ Adam's step counters, a few bytes each)
    assert 16 * total <= full < 16 * total + 64 * 1024
    # LoRA: the frozen weights alone, and the four copies of the adapters only
    assert 4 * total + 16 * lora_trained <= lora < 4 * total + 16 * lora_trained + 64 * 1024
    d, r = NLLB_SMALL.d_model, 8
    assert lora_trained == 2 * r * (d + d) * (6 + 2 * 6)  # q and v of 18 attentions, r (in + out) each
    assert lora < full / 3.5
