"""Fine-tuning: `tmt train --config X.yaml --init-from CKPT` starts from a checkpoint's weights, architecture and
tokenizer, with a fresh optimizer and schedule; resume, EMA and validation work as for any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, tokenizers_from_checkpoint
from transformer_mt.config import ConfigError, to_dict
from transformer_mt.training import Trainer, set_up, train, train_config_from_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _yaml(
    tmp_path: Path, corpus: dict[str, Path], out: Path, *, model: dict | None = None, train_extra: dict | None = None
) -> Path:
    """A fine-tuning config as a user writes it: data and training only (the model and tokenizer come from the
    checkpoint)."""
    cfg = {
        "data": {
            "train_src": str(corpus["train.en"]),
            "train_tgt": str(corpus["train.de"]),
            "valid_src": str(corpus["val.en"]),
            "valid_tgt": str(corpus["val.de"]),
        },
        "train": {
            "out_dir": str(out),
            "device": "cpu",
            "threads": 1,
            "lr_schedule": "inverse_sqrt",
            "lr": 0.002,
            "warmup_updates": 5,
            "max_tokens": 2000,
            "max_updates": 20,
            "validate_every": 5,
            "valid_bleu_sentences": -1,
            "log_every": 1,
            "keep_last": 0,
            "seed": 3,
            **(train_extra or {}),
        },
    }
    if model:
        cfg["model"] = model
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path


def _metrics(out: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_a_fine_tuning_run_starts_from_the_checkpoint_with_a_fresh_optimizer(
    tiny_checkpoint_postnorm, corpus_slice, tmp_path
):
    init = load_checkpoint(tiny_checkpoint_postnorm)
    path = _yaml(tmp_path, corpus_slice, tmp_path / "ft", model={"dropout": 0.2})
    cfg = train_config_from_cli(
        config=path, overrides=[], resume=None, overwrite=False, init_from=tiny_checkpoint_postnorm
    )
    saved = config_from_checkpoint(init)
    assert cfg.model == type(saved.model)(
        **{**vars(saved.model), "dropout": 0.2}
    )  # its architecture, the config's dropout
    assert cfg.tokenizer == saved.tokenizer and cfg.train.init_from == str(tiny_checkpoint_postnorm)
    trainer = Trainer(set_up(cfg, resume=False))
    try:
        for name, tensor in trainer.model.state_dict().items():
            assert torch.equal(tensor, init["model"][name]), name
        assert trainer.progress.update == 0 and not trainer.state.optimizer.state
        assert trainer.parts.state.tokenizers == tokenizers_from_checkpoint(init, saved)
    finally:
        trainer.close()


def test_fine_tuning_lowers_the_validation_loss_and_resumes_exactly(
    tiny_checkpoint_postnorm, corpus_slice, spm_model, tmp_path
):
    whole = tmp_path / "whole"
    cfg = train_config_from_cli(
        config=_yaml(tmp_path, corpus_slice, whole),
        overrides=[],
        resume=None,
        overwrite=False,
        init_from=tiny_checkpoint_postnorm,
    )
    train(cfg)
    valid = [r["val_loss"] for r in _metrics(whole, "valid")]
    assert len(valid) == 4 and valid[-1] < valid[0], valid
    first_loss = _metrics(whole, "train")[0]
    fresh = (
        tmp_path / "fresh"
    )  # the same architecture and tokenizer without --init-from starts far higher: the weights were used
    same = [
        f"model.{k}={json.dumps(v)}"
        for k, v in to_dict(config_from_checkpoint(load_checkpoint(tiny_checkpoint_postnorm)))["model"].items()
    ]
    yaml = _yaml(tmp_path, corpus_slice, fresh, train_extra={"max_updates": 1})
    train(
        train_config_from_cli(
            config=yaml, overrides=[*same, f"tokenizer.model={spm_model}"], resume=None, overwrite=False
        )
    )
    assert first_loss["loss"] < _metrics(fresh, "train")[0]["loss"] - 1.0

    split = tmp_path / "split"
    yaml = _yaml(tmp_path, corpus_slice, split, train_extra={"max_updates": 10})
    train(
        train_config_from_cli(
            config=yaml, overrides=[], resume=None, overwrite=False, init_from=tiny_checkpoint_postnorm
        )
    )
    train(
        train_config_from_cli(config=None, overrides=["train.max_updates=20"], resume=split, overwrite=False),
        resume=True,
    )
    a, b = load_checkpoint(whole / "checkpoint_last.pt"), load_checkpoint(split / "checkpoint_last.pt")
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_a_config_that_contradicts_the_checkpoint_is_refused_in_one_line(
    tiny_checkpoint_postnorm, corpus_slice, tmp_path, capsys
):
    path = _yaml(tmp_path, corpus_slice, tmp_path / "bad", model={"d_model": 64})
    code, _, err = run_cli(["train", "--config", path, "--init-from", tiny_checkpoint_postnorm], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert (
        f"{path}: model.d_model=64 contradicts --init-from {tiny_checkpoint_postnorm}, whose model.d_model is 32" in err
    )
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match="--init-from starts a new run"):
        train_config_from_cli(
            config=path, overrides=[], resume=tmp_path, overwrite=False, init_from=tiny_checkpoint_postnorm
        )
    code, _, err = run_cli(
        ["train", "--config", path, "--init-from", tmp_path / "missing.pt", "--set", "model.d_model=32"], capsys
    )
    assert code != 0 and "missing.pt" in err and len(err.strip().splitlines()) == 1
