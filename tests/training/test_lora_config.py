"""train.lora and train.freeze: the keys as users write them (a list or a comma string), and every bad value refused
in one line that names the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from transformer_mt.config import ConfigError, load_config


def test_targets_read_as_a_list_or_a_comma_string(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lora: {rank: 8, alpha: 32, targets: [q, v, ffn2]}\n", encoding="utf-8")
    from_yaml = load_config(path, check_files=False).train.lora
    overrides = ["train.lora.rank=8", "train.lora.alpha=32", "train.lora.targets=q, v,ffn2"]
    from_set = load_config(None, overrides).train.lora
    assert from_yaml == from_set and from_set.targets == ["q", "v", "ffn2"]
    assert load_config(None, []).train.lora.rank == 0  # off by default: every weight trains, as before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.lora.rank=-1"], "train.lora.rank: -1 is negative"),
        (["train.lora.rank=4", "train.lora.targets=q,attn"], "train.lora.targets: 'attn' is not one of q, k, v, o"),
        (["train.lora.rank=4", "train.lora.targets=[]"], "train.lora.targets: is empty"),
        (["train.lora.targets=q,q"], "train.lora.targets: names a projection twice"),
        (["train.lora.targets=3"], "train.lora.targets: expected a list of names (or one comma string), got 3"),
        (["train.lora.alpha=0"], "train.lora.alpha: 0 must be positive"),
        (["train.lora.alpha=-2"], "train.lora.alpha: -2 must be positive"),
        (["train.lora.dropout=1"], "train.lora.dropout: 1 is outside [0, 1)"),
        (["train.lora.ranks=4"], "train.lora: unknown key 'ranks'; did you mean 'rank'?"),
        (["train.freeze.encoder_layers=-1"], "train.freeze.encoder_layers: -1 is outside [0, model.encoder_layers=6]"),
        (["train.freeze.decoder_layers=7"], "train.freeze.decoder_layers: 7 is outside [0, model.decoder_layers=6]"),
        (["train.freeze.encoder=maybe"], "train.freeze.encoder: expected"),
        (["train.lora.rank=4", "train.freeze.encoder=true"], "train.freeze: applies without train.lora only"),
    ],
)
def test_bad_values_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides, check_files=False)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_command_line_says_it_in_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lora: {rank: 4, targets: 'q,x'}\n", encoding="utf-8")
    code, _, err = run_cli(["train", "-c", path], capsys)
    assert code == 2 and err.count("\n") == 1 and "train.lora.targets: 'x' is not one of" in err


def test_tmt_merge_of_a_file_that_is_not_there_is_one_line(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["merge", "-c", tmp_path / "nope.pt"], capsys)
    assert code == 2 and err.count("\n") == 1 and "nope.pt" in err
    torch.save({"x": 1}, tmp_path / "out.pt")
    code, _, err = run_cli(["merge", "-c", tmp_path / "nope.pt", "-o", tmp_path / "out.pt"], capsys)
    assert code == 2 and "--force" in err and err.count("\n") == 1


def test_overwrite_removes_the_adapter_files_with_their_checkpoints(tmp_path: Path) -> None:
    from transformer_mt.training.rundir import remove_old_run

    names = ["checkpoint_last.pt", "checkpoint_last.adapter.pt", "checkpoint_4.pt", "checkpoint_4.adapter.pt"]
    for name in [*names, "notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    assert remove_old_run([tmp_path / "checkpoint_last.pt", tmp_path / "checkpoint_4.pt"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_averaging_lora_checkpoints_is_refused_in_one_line(tmp_path: Path) -> None:
    from transformer_mt.checkpoint import CheckpointError, average_checkpoints, save_checkpoint

    path = save_checkpoint({"model": {"encoder.0.ffn.fc1.lora.A": torch.zeros(2, 3)}}, tmp_path / "checkpoint_4.pt")
    with pytest.raises(CheckpointError, match="holds LoRA adapters, which do not average") as err:
        average_checkpoints([path, path])
    assert "\n" not in str(err.value)
