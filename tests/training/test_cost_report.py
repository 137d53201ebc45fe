"""The training cost report at the end of `tmt train` (metrics.jsonl summary + train.log) and
TensorBoard logging of the same scalars."""

from __future__ import annotations

import itertools
import json

import pytest

from transformer_mt.runtime import forward_flops
from transformer_mt.training import Trainer, set_up, update_schedule

pytestmark = pytest.mark.slow


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def test_summary_reports_flops_of_the_batches_trained_on(pairs64, spm_model, tmp_path):
    from tests.conftest import run_config

    cfg = run_config(
        pairs64,
        spm_model,
        tmp_path / "run",
        "train.max_updates=6",
        "train.max_tokens=200",
        "train.log_every=2",
        "train.validate_every=100",
        "train.peak_tflops=0.05",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=16",
        "model.heads=2",
        "model.d_ff=32",
    )
    trainer = Trainer(set_up(cfg, resume=False))
    trainer.run()
    # Independently: replay the schedule, build every batch, count 3 x forward at its padded shape.
    vocab = trainer.parts.state.tokenizers[1].vocab_size
    expected_flops = expected_tokens = 0
    for u in itertools.islice(update_schedule(trainer.train_data, cfg.train, world_size=1), 6):
        for idx in u.batches:
            b = trainer.train_data.get_batch(idx)
            expected_flops += 3 * forward_flops(
                cfg.model, vocab=vocab, batch=b.src.size(0), src_len=b.src.size(1), tgt_len=b.tgt_in.size(1)
            )
            expected_tokens += b.ntokens
    summary = [r for r in records(tmp_path / "run") if r["kind"] == "summary"][-1]
    assert summary["target_tokens"] == expected_tokens
    assert summary["train_flops"] == expected_flops
    assert summary["flops_per_token"] == pytest.approx(expected_flops / expected_tokens)
    assert summary["peak_tflops"] == 0.05 and summary["peak_source"] == "config"
    assert summary["mfu"] == pytest.approx(summary["achieved_tflops"] / 0.05)
    seconds = summary["update_seconds"]  # rounded to 0.01 s in the record
    assert summary["achieved_tflops"] * 1e12 * seconds == pytest.approx(expected_flops, rel=0.006 / seconds)
    assert 0 < summary["update_seconds"] <= summary["wall"]
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    assert f"training cost: {expected_tokens:,} target tokens" in log and "MFU" in log


def test_tensorboard_gets_the_same_scalars(pairs64, spm_model, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.conftest import run_config

    cfg = run_config(
        pairs64,
        spm_model,
        tmp_path / "run",
        "train.max_updates=4",
        "train.max_tokens=200",
        "train.log_every=2",
        "train.validate_every=4",
        "train.valid_bleu_sentences=-1",
        "train.tensorboard=true",
        "train.peak_tflops=0.05",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=16",
        "model.heads=2",
        "model.d_ff=32",
    )
    Trainer(set_up(cfg, resume=False)).run()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    train = [r for r in records(tmp_path / "run") if r["kind"] == "train"]
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in losses] == [r["update"] for r in train]
    assert [v for _, v in losses] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    valid = [r for r in records(tmp_path / "run") if r["kind"] == "valid"]
    assert [e.value for e in events.Scalars("valid/loss")] == pytest.approx([r["val_loss"] for r in valid], rel=1e-6)
