"""A run directory keeps its bytes: `--overwrite` removes the old run only once the new one has passed
every check, and the run lock never follows a symlink nor truncates a file it did not write."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.training.test_resume_safety import config, write_config
from transformer_mt.training import RunLock, train
from transformer_mt.training.rundir import RunDirError

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _old_run(pairs64, spm_model, run: Path) -> dict[str, bytes]:
    train(config(pairs64, spm_model, run, "train.max_updates=2", "train.save_every=1"))
    return {p.name: p.read_bytes() for p in sorted(run.glob("*.pt"))}


def test_overwrite_refused_by_a_later_check_keeps_the_old_run(pairs64, spm_model, tmp_path, capsys):
    run = tmp_path / "run"
    before = _old_run(pairs64, spm_model, run)
    assert "checkpoint_last.pt" in before
    config_before = (run / "config.yaml").read_bytes()
    cfg = write_config(
        tmp_path / "c.yaml", pairs64, spm_model, run, "train.valid_beam=600", "train.valid_bleu_sentences=4"
    )
    capsys.readouterr()
    code, _, err = run_cli(["train", "-c", cfg, "--overwrite"], capsys)
    assert code == 2 and "train.valid_beam=600" in err
    assert {p.name: p.read_bytes() for p in sorted(run.glob("*.pt"))} == before
    assert (run / "config.yaml").read_bytes() == config_before  # `--resume` still continues the old run


def test_lock_does_not_follow_a_symlink(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"keep me\n")
    (run / ".lock").symlink_to(victim)
    with pytest.raises(RunDirError, match=r"\.lock"):
        RunLock(run)
    assert victim.read_bytes() == b"keep me\n"


def test_lock_does_not_truncate_a_file_that_is_not_a_lock(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_bytes(b"someone's notes\n")
    with pytest.raises(RunDirError, match=r"\.lock"):
        RunLock(run)
    assert (run / ".lock").read_bytes() == b"someone's notes\n"
    (run / ".lock").write_bytes(b"12345\n")  # a lock a finished run left: reused
    RunLock(run).release()
    assert (run / ".lock").read_bytes() == f"{os.getpid()}\n".encode()
    shutil.rmtree(run)
