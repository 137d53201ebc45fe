"""``train.packed``: which runs pack their batches, what the update hands the loss module, and a run trained on
packed batches against the same run on padded ones (dropout 0: the same losses and weights up to float rounding)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_config, tiny_model
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.data import collate
from transformer_mt.model import Packing, TeacherForcedLoss
from transformer_mt.training import train
from transformer_mt.training.step import UpdateStats, loss_inputs, packs_batches

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    ("setting", "ops", "device", "packed"),
    [
        ("auto", "cpu", CPU, False),  # the default on a CPU: padded, as before
        ("auto", "reference", CPU, False),
        ("auto", "cuda", CUDA, True),  # the cuda backend on a GPU: flash attention's varlen kernel
        ("auto", "reference", CUDA, False),
        ("on", "cpu", CPU, True),
        ("on", "reference", CUDA, True),
        ("off", "cuda", CUDA, False),
    ],
)
def test_train_packed_resolves_auto_to_the_cuda_backend_on_a_gpu(setting, ops, device, packed):
    assert packs_batches(setting, ops=ops, device=device) is packed


def test_the_update_hands_the_loss_module_the_padded_or_the_packed_batch():
    batch = collate([([11, 12, 13], [21, 22]), ([14], [23, 24, 25]), ([15, 16], [26])])
    args, kwargs = loss_inputs(batch, CPU, packed_pad=None)
    assert [a.shape for a in args[:3]] == [batch.src.shape, batch.tgt_in.shape, batch.tgt_out.shape]
    assert kwargs == {"src_padded": True}
    packed_args, packed_kwargs = loss_inputs(batch, CPU, packed_pad=0)
    packing = packed_kwargs["packing"]
    assert isinstance(packing, Packing) and set(packed_kwargs) == {"packing"}
    assert [a.numel() for a in packed_args] == [9, 9, 9]  # 6 source pieces + 3 EOS; 6 target pieces + 3 starts / EOS
    assert packing.src.cu_seqlens.tolist() == [0, 4, 6, 9] and packing.tgt.cu_seqlens.tolist() == [0, 3, 7, 9]
    module = TeacherForcedLoss(tiny_model().train(), label_smoothing=0.1)
    padded_loss, packed_loss = module(*args, **kwargs), module(*packed_args, **packed_kwargs)
    torch.testing.assert_close(packed_loss[0], padded_loss[0], rtol=1e-5, atol=0)
    assert packed_loss[2] == padded_loss[2] == batch.ntokens == 9


@pytest.mark.slow
def test_a_run_on_packed_batches_trains_as_on_padded_ones(pairs64, spm_model, tmp_path):
    common = [
        "train.threads=1",
        "model.encoder_layers=2",
        "model.decoder_layers=2",
        "model.d_model=32",
        "model.heads=4",
        "model.d_ff=64",
        "model.dropout=0.0",
        "train.max_tokens=300",
        "train.update_freq=2",
        "train.max_updates=6",
        "train.validate_every=6",
        "train.valid_bleu_sentences=-1",
        "train.lr_schedule=inverse_sqrt",
        "train.lr=0.002",
        "train.warmup_updates=3",
    ]
    losses: dict[str, list[float]] = {"off": [], "on": []}
    for setting, seen in losses.items():
        cfg = run_config(pairs64, spm_model, tmp_path / setting, *common, f"train.packed={setting}")

        def record(update: int, stats: UpdateStats, seen: list[float] = seen) -> None:
            seen.append(float(stats.loss))

        train(cfg, on_update=record)
    assert len(losses["on"]) == 6
    assert losses["on"] == pytest.approx(losses["off"], rel=1e-4)
    padded = load_checkpoint(tmp_path / "off" / "checkpoint_last.pt")["model"]
    packed = load_checkpoint(tmp_path / "on" / "checkpoint_last.pt")["model"]
    d = 32  # the key bias, rows [d, 2d) of in_bias, has a gradient of exactly 0 (a constant added to every score of
    # a row, which the softmax removes): only float rounding, which Adam scales up to steps of lr, so it is left out
    for key, value in padded.items():
        keep = torch.ones(value.size(0), dtype=torch.bool)
        if key.endswith("in_bias"):
            keep[d : 2 * d] = False
        torch.testing.assert_close(packed[key][keep], value[keep], rtol=0, atol=1e-5, msg=f"{key} differs")
