"""Fine-tuning an imported MarianMT model: `tmt import`, then `tmt train --init-from` on a Multi30k slice; the
validation loss falls, and `--resume` of that run continues exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.hf.conftest import build_marian_dir
from transformer_mt.checkpoint import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def imported(multi30k, tmp_path_factory) -> Path:
    """A tiny random MarianMT model with separate vocabularies (the target's padding is the source vocabulary's
    <pad> id, as in OPUS-MT's conversion), imported as a tmt checkpoint."""
    from transformer_mt.cli import main

    root = tmp_path_factory.mktemp("marian_ft")
    marian = build_marian_dir(root, multi30k, shared=False, activation="relu", seed=1, scale=0.5, eos_bias=0.3)
    with pytest.raises(SystemExit) as done:
        main(["import", str(marian.path), "--from", "marian-hf", "-o", str(root / "model.pt")])
    assert not done.value.code
    return root / "model.pt"


def _config(tmp_path: Path, corpus: dict[str, Path], out: Path, max_updates: int) -> Path:
    cfg = {
        "data": {
            "train_src": str(corpus["train.en"]),
            "train_tgt": str(corpus["train.de"]),
            "valid_src": str(corpus["val.en"]),
            "valid_tgt": str(corpus["val.de"]),
            "max_len": 100,  # the imported model has 128 positions
        },
        "model": {"dropout": 0.1},  # fine-tuning may change the dropout rates, nothing else of the model
        "train": {
            "out_dir": str(out),
            "device": "cpu",
            "threads": 1,
            "lr_schedule": "inverse_sqrt",
            "lr": 0.003,
            "warmup_updates": 4,
            "max_tokens": 1500,
            "max_updates": max_updates,
            "validate_every": 4,
            "valid_bleu_sentences": -1,
            "keep_last": 0,
            "seed": 5,
        },
    }
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def test_an_imported_model_fine_tunes_and_resumes_exactly(imported, corpus_slice, tmp_path, capsys):
    whole, split = tmp_path / "whole", tmp_path / "split"
    code, _, err = run_cli(
        ["train", "--config", _config(tmp_path, corpus_slice, whole, 12), "--init-from", imported], capsys
    )
    assert code == 0, err
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    val = [r["val_loss"] for r in records if r["kind"] == "valid"]
    assert len(val) == 3 and val[2] < val[0], val
    start = load_checkpoint(imported)["model"]
    assert not torch.equal(
        load_checkpoint(whole / "checkpoint_last.pt")["model"]["src_embed.weight"], start["src_embed.weight"]
    )

    code, _, err = run_cli(
        ["train", "--config", _config(tmp_path, corpus_slice, split, 6), "--init-from", imported], capsys
    )
    assert code == 0, err
    code, _, err = run_cli(["train", "--resume", split, "--set", "train.max_updates=12"], capsys)
    assert code == 0, err
    a, b = load_checkpoint(whole / "checkpoint_last.pt"), load_checkpoint(split / "checkpoint_last.pt")
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert (
        a["tokenizers"]["tgt_vocab"] == load_checkpoint(imported)["tokenizers"]["tgt_vocab"]
    )  # the vocabulary travels with the run
