"""LAWA-style averaging over a wider window: train.keep_every keeps the numbered checkpoints at multiples of K past
keep_last pruning, and `tmt average --run DIR --every K --last N` averages the N newest of them."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_cli, run_config
from transformer_mt.checkpoint import (
    load_checkpoint,
    numbered_checkpoint_path,
    pack_tokenizers,
    prune_checkpoints,
    save_checkpoint,
)
from transformer_mt.config import load_config, to_dict
from transformer_mt.training import train


def fake_run(run_dir, updates: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """checkpoint_<u>.pt for each update u, with known random weights (one config and tokenizer: averageable)."""
    config = to_dict(load_config(None, []))
    weights = {}
    for u in updates:
        g = torch.Generator().manual_seed(u)
        weights[u] = {
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g).half(),
            "steps": torch.tensor(u),
        }
        save_checkpoint(
            {"model": weights[u], "config": config, "tokenizers": pack_tokenizers(b"proto")},
            numbered_checkpoint_path(run_dir, u),
        )
    return weights


def numbered(run_dir) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in run_dir.glob("checkpoint_[0-9]*.pt"))


def test_pruning_keeps_the_multiples_of_keep_every(tmp_path):
    for u in range(250, 3001, 250):
        numbered_checkpoint_path(tmp_path, u).write_bytes(b"x")
    (tmp_path / "checkpoint_last.pt").write_bytes(b"x")
    removed = prune_checkpoints(tmp_path, 3, keep_every=1000)
    assert numbered(tmp_path) == [1000, 2000, 2500, 2750, 3000]  # the newest 3, and 1000 and 2000 besides
    assert sorted(int(p.stem.split("_")[1]) for p in removed) == [250, 500, 750, 1250, 1500, 1750, 2250]
    assert (tmp_path / "checkpoint_last.pt").exists()
    prune_checkpoints(tmp_path, 3)  # without keep_every the old multiples go
    assert numbered(tmp_path) == [2500, 2750, 3000]


def test_every_averages_the_newest_multiples(tmp_path, capsys):
    weights = fake_run(tmp_path, [1000, 2000, 2500, 2750, 3000, 4000, 4500])
    out = tmp_path / "lawa.pt"
    code, _, err = run_cli(["average", "--run", tmp_path, "--every", 1000, "--last", 3, "-o", out], capsys)
    assert code == 0, err
    avg = load_checkpoint(out)
    picked = [2000, 3000, 4000]
    assert avg["averaged_from"] == [str(numbered_checkpoint_path(tmp_path, u)) for u in picked]
    mean_w = torch.stack([weights[u]["w"].double() for u in picked]).sum(0) / 3
    mean_b = torch.stack([weights[u]["b"].double() for u in picked]).sum(0) / 3
    torch.testing.assert_close(avg["model"]["w"], mean_w.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(avg["model"]["b"], mean_b.half(), rtol=0, atol=1e-3)
    assert avg["model"]["steps"].item() == 4000  # an integer buffer comes from the newest, not averaged


def test_too_few_multiples_is_one_line_naming_what_was_found(tmp_path, capsys):
    fake_run(tmp_path, [500, 1000, 1500, 2000, 2500])
    code, out, err = run_cli(
        ["average", "--run", tmp_path, "--every", 1000, "--last", 3, "-o", tmp_path / "x.pt"], capsys
    )
    assert code == 2 and out == ""
    assert err == (
        f"tmt: error: {tmp_path}: asked for the last 3 checkpoints at multiples of 1000 updates but found 2 (updates: "
        "1000, 2000); ask for fewer with --last, or train with train.keep_every=1000 (and numbered saves on those "
        "updates) so pruning keeps them\n"
    )
    assert not (tmp_path / "x.pt").exists()
    code, _, err = run_cli(
        [
            "average",
            tmp_path / "checkpoint_500.pt",
            tmp_path / "checkpoint_1000.pt",
            "--every",
            1000,
            "-o",
            tmp_path / "x.pt",
        ],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1 and "--every 1000" in err and "--run" in err


@pytest.mark.slow
def test_training_keeps_every_kth_checkpoint(pairs64, spm_model, tmp_path):
    out = tmp_path / "run"
    train(
        run_config(
            pairs64,
            spm_model,
            out,
            "train.threads=1",
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "model.d_model=32",
            "model.heads=2",
            "model.d_ff=64",
            "train.max_tokens=300",
            "train.valid_bleu_sentences=-1",
            "train.validate_every=100",
            "train.save_every=2",
            "train.keep_last=2",
            "train.keep_every=4",
            "train.max_updates=14",
        )
    )
    assert numbered(out) == [4, 8, 12, 14]  # saved every 2 updates; the newest 2 (12, 14) and the multiples of 4
