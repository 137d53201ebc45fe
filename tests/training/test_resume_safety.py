"""A run directory loses nothing. Resume from the newest complete checkpoint, no run started over another
or beside another, validation data checked at load, signals during a validation (the final one too, and
during the EMA swap), resuming after things changed, the NaN guard's bound, metrics.jsonl without repeats,
and SIGKILL at random moments. Data-loss tests read the files on disk."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli, run_config
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import ConfigError
from transformer_mt.data import DataError
from transformer_mt.evaluation import ValidationError
from transformer_mt.training import (
    MAX_NONFINITE_UPDATES,
    RunLock,
    RunLog,
    Trainer,
    TrainError,
    UpdateStats,
    resumed_config,
    set_up,
    train,
)
from transformer_mt.training import policy as policy_module

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

# 1+1 layers, d_model 16: an update and its checkpoint take milliseconds.
TINY = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=16",
    "model.heads=2",
    "model.d_ff=32",
    "model.max_positions=64",
    "data.max_len=60",
    "train.threads=1",
    "train.max_tokens=300",
    "train.valid_bleu_sentences=-1",
    "train.lr_schedule=inverse_sqrt",
    "train.warmup_updates=4",
    "train.lr=0.001",
]


def config(pairs64, spm_model, out: Path, *extra: str):
    return run_config(pairs64, spm_model, out, *TINY, *extra)


def write_config(path: Path, pairs64, spm_model, out: Path, *extra: str) -> Path:
    """The same as a YAML file, for `tmt train -c`."""
    from transformer_mt.config import to_dict

    path.write_text(json.dumps(to_dict(config(pairs64, spm_model, out, *extra))), encoding="utf-8")
    return path


def stop_at(update: int):
    """An on_update callback that kills the run after `update` updates (KeyboardInterrupt: no handler saves)."""

    def callback(u: int, _stats: UpdateStats) -> None:
        if u == update:
            raise KeyboardInterrupt

    return callback


def update_of(path: Path) -> int:
    return load_checkpoint(path)["progress"]["update"]


def resume(run: Path, *overrides: str, **kwargs):
    return train(resumed_config(run, list(overrides)), resume=True, **kwargs)


# ---------------------------------------------------------------- a killed run resumes from its newest checkpoint
def test_every_save_writes_checkpoint_last(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(config(pairs64, spm_model, run, "train.save_every=1", "train.max_updates=20"), on_update=stop_at(4))
    assert (
        update_of(run / "checkpoint_last.pt") == 3
    )  # the saves of updates 1-3 each wrote it; update 4 died before saving
    assert update_of(run / "checkpoint_3.pt") == 3
    result = resume(run, "train.max_updates=6")
    assert (
        result.progress.update == 6
        and "resumed from " + str(run / "checkpoint_last.pt") + " at update 3" in (run / "train.log").read_text()
    )


def test_resume_takes_a_numbered_checkpoint_newer_than_last_and_skips_a_broken_one(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(
            config(pairs64, spm_model, run, "train.save_every=1", "train.max_updates=20", "train.keep_last=0"),
            on_update=stop_at(5),
        )
    shutil.copyfile(
        run / "checkpoint_2.pt", run / "checkpoint_last.pt"
    )  # killed before last was renamed at updates 3 and 4
    trainer = Trainer(set_up(resumed_config(run, []), resume=True))
    assert trainer.progress.update == 4 and trainer.parts.resumed_from == run / "checkpoint_4.pt"
    trainer.close()
    (run / "checkpoint_4.pt").write_bytes((run / "checkpoint_4.pt").read_bytes()[:1000])  # torn by a disk error
    trainer = Trainer(set_up(resumed_config(run, []), resume=True))
    assert trainer.progress.update == 3 and "skipping checkpoint_4.pt" in (run / "train.log").read_text()
    trainer.close()


def test_new_run_over_an_existing_one_is_refused_unless_overwrite(pairs64, spm_model, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(
        _one_checkpoint(pairs64, spm_model, tmp_path), run / "checkpoint_7.pt"
    )  # a killed run: numbered only
    before = (run / "checkpoint_7.pt").read_bytes()
    cfg = write_config(tmp_path / "c.yaml", pairs64, spm_model, run, "train.max_updates=2", "train.save_every=1")
    capsys.readouterr()
    code, _, err = run_cli(["train", "-c", cfg], capsys)
    assert (
        code == 2
        and err.count("\n") == 1
        and "already holds a run (checkpoint_7.pt)" in err
        and f"--resume {run}" in err
    )
    assert "--overwrite" in err and (run / "checkpoint_7.pt").read_bytes() == before
    code, _, err = run_cli(["train", "-c", cfg, "--overwrite"], capsys)
    assert code == 0 and "removed the previous run's 1 checkpoints" in err
    assert not (run / "checkpoint_7.pt").exists() and update_of(run / "checkpoint_last.pt") == 2
    code, _, err = run_cli(["train", "--resume", run, "--overwrite"], capsys)
    assert code == 2 and "--overwrite starts a new run" in err


def _one_checkpoint(pairs64, spm_model, tmp_path) -> Path:
    out = tmp_path / "other"
    train(config(pairs64, spm_model, out, "train.max_updates=1"))
    return out / "checkpoint_last.pt"


# ---------------------------------------------------------------- one process per run directory
def test_second_process_on_a_run_gets_the_holders_pid(pairs64, spm_model, tmp_path, capsys):
    run = tmp_path / "run"
    train(config(pairs64, spm_model, run, "train.max_updates=2"))
    before = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    capsys.readouterr()
    lock = RunLock(run)  # as a running `tmt train` holds it
    code, _, err = run_cli(["train", "--resume", run], capsys)
    assert code == 2 and err == (
        f"tmt: error: {run}: another tmt train (pid {os.getpid()}) is using this run directory; "
        "wait for it to end or stop it, or set train.out_dir to another directory\n"
    )
    assert {p.name: p.read_bytes() for p in run.glob("*.pt")} == before
    lock.release()
    assert resume(run, "train.max_updates=3").progress.update == 3


# ---------------------------------------------------------------- the validation set is checked when loaded
def test_empty_validation_set_is_refused_before_training(pairs64, spm_model, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n\n", encoding="utf-8")
    cfg = config(
        pairs64,
        spm_model,
        tmp_path / "run",
        f"data.valid_src={empty}",
        f"data.valid_tgt={empty}",
        "train.validate_every=2",
    )
    with pytest.raises(DataError, match=f"{empty}: the validation file holds no text"):
        train(cfg, on_update=lambda *_: pytest.fail("trained before checking the validation set"))
    # Text on both sides, but never on the same line: no pair survives, which only encoding can tell.
    (tmp_path / "v.en").write_text("A dog.\n\n", encoding="utf-8")
    (tmp_path / "v.de").write_text("\nEin Hund.\n", encoding="utf-8")
    cfg = config(
        pairs64,
        spm_model,
        tmp_path / "run2",
        f"data.valid_src={tmp_path / 'v.en'}",
        f"data.valid_tgt={tmp_path / 'v.de'}",
        "train.validate_every=2",
    )
    with pytest.raises(ValidationError, match=f"{tmp_path / 'v.en'}: the validation set holds no pairs"):
        train(cfg, on_update=lambda *_: pytest.fail("trained before checking the validation set"))


def test_validation_pairs_longer_than_the_model_are_left_out_and_counted(pairs64, spm_model, tmp_path):
    src, tgt = pairs64["val.en"].read_text().splitlines(), pairs64["val.de"].read_text().splitlines()
    src[3] = " ".join(["a dog runs through the snow"] * 40)  # hundreds of pieces; learned positions hold 64
    (tmp_path / "v.en").write_text("\n".join(src) + "\n")
    (tmp_path / "v.de").write_text("\n".join(tgt) + "\n")
    run = tmp_path / "run"
    result = train(
        config(
            pairs64,
            spm_model,
            run,
            f"data.valid_src={tmp_path / 'v.en'}",
            f"data.valid_tgt={tmp_path / 'v.de'}",
            "train.max_updates=2",
            "train.validate_every=1",
            "train.valid_bleu_sentences=0",
            "model.positions=learned",
        )
    )
    log = (run / "train.log").read_text()
    assert (
        "validation: 1 of 16 pairs longer than 63 pieces (model.max_positions=64) left out of the validation loss"
        in log
    )
    assert "validation BLEU: 1 of 16 sources longer than 63 pieces truncated" in log
    assert result.progress.last_validated == 2 and "val_bleu" in result.last_validation


# ------------------------------------------------------- best before last; signals in a validation and the final save
def test_best_is_written_before_last(pairs64, spm_model, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_save, real_copy = policy_module.save_checkpoint, policy_module.copy_checkpoint

    def dies_at_last(real):
        def save(state_or_source, path):
            if Path(path).name == "checkpoint_last.pt" and update_of_state(state_or_source) == 4:
                raise KeyboardInterrupt  # the kill between the two writes
            return real(state_or_source, path)

        return save

    def update_of_state(x):
        return x["progress"]["update"] if isinstance(x, dict) else update_of(Path(x))

    monkeypatch.setattr(policy_module, "save_checkpoint", dies_at_last(real_save))
    monkeypatch.setattr(policy_module, "copy_checkpoint", dies_at_last(real_copy))
    with pytest.raises(KeyboardInterrupt):
        train(config(pairs64, spm_model, run, "train.max_updates=8", "train.validate_every=2"))
    assert update_of(run / "checkpoint_last.pt") == 2
    assert (
        update_of(run / "checkpoint_best.pt") == 4
    )  # the validation of update 4 improved (a tiny model at its start always does)


def _own_tqdm_lock() -> None:
    """In a forked child: a lock of its own for tqdm. Its default one is a multiprocessing semaphore shared
    with the parent, and a child SIGKILLed while writing a log line would hold it for ever (the parent's
    next progress bar or log line would wait on it)."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _train_and_sigterm_in_final_validation(cfg_path: str) -> None:
    """In a forked child: `tmt train`, sending itself SIGTERM as the final validation starts."""
    _own_tqdm_lock()
    real_validate = Trainer.validate

    def validate(self):
        if (
            self.progress.update == self.t.max_updates
        ):  # the final one (max_updates is not a multiple of validate_every)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # a long validation; the signal must cut it short
        return real_validate(self)

    Trainer.validate = validate  # type: ignore[method-assign]
    from transformer_mt.cli import main

    try:
        main(["train", "-c", cfg_path])
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    os._exit(0)


def test_sigterm_during_the_final_validation_saves_checkpoint_last(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", pairs64, spm_model, run, "train.max_updates=5", "train.validate_every=2")
    child = multiprocessing.get_context("fork").Process(target=_train_and_sigterm_in_final_validation, args=(str(cfg),))
    child.start()
    child.join(60)
    assert child.exitcode == 130  # not -SIGTERM: the handler was still installed, and the run says it was interrupted
    assert update_of(run / "checkpoint_last.pt") == 5
    log = (run / "train.log").read_text()
    assert "validation at update 5 cut short by the signal" in log and "interrupted at update 5: saved" in log
    assert resume(run).progress.update == 5  # nothing left to train; the final validation runs now
    assert "validation at update 5:" in (run / "train.log").read_text()


def _sigint_in_validation(trainer: Trainer, monkeypatch, *, at_update: int, where: str) -> None:
    """Arrange a SIGINT to this process in the validation at `at_update`: right after the EMA weights are copied
    in ("ema_swap", the moment a handler that raised would lose the raw weights), or in the first validation
    batch's decoder pass ("batch")."""
    armed = []

    def on_update(update: int, _stats: UpdateStats) -> None:
        if update == at_update:
            armed.append(True)

    trainer.on_update = on_update

    def fire() -> None:
        armed.clear()
        os.kill(os.getpid(), signal.SIGINT)

    if where == "ema_swap":
        real_copy = torch._foreach_copy_

        def copy(dst, src, *args, **kwargs):
            real_copy(dst, src, *args, **kwargs)
            if armed:  # the first copy after the update: the shadow into the parameters, at the start of the validation
                fire()

        monkeypatch.setattr(torch, "_foreach_copy_", copy)
    else:
        trainer.model.decoder[0].register_forward_pre_hook(
            lambda module, _args: fire() if armed and not module.training else None
        )


@pytest.mark.parametrize("where", ["ema_swap", "batch"])
def test_a_stop_during_a_validation_leaves_checkpoint_last_resumable_exactly(
    pairs64, spm_model, tmp_path, monkeypatch, where
):
    """A signal during the EMA swap or a validation batch cuts the validation short and saves; 4 + resumed 2 updates ==
    6 straight ones, bit for bit: weights, EMA, optimizer moments, and the final validation's metrics."""
    common = [
        "train.ema_decay=0.9",
        "model.dropout=0.1",
        "train.validate_every=2",
        "train.valid_bleu_sentences=4",
        "train.max_updates=6",
    ]
    train(config(pairs64, spm_model, tmp_path / "a", *common))
    trainer = Trainer(set_up(config(pairs64, spm_model, tmp_path / "b", *common), resume=False))
    _sigint_in_validation(trainer, monkeypatch, at_update=4, where=where)
    result = trainer.run()
    monkeypatch.undo()
    assert (
        result.stop_reason == "interrupted"
        and result.progress.update == 4
        and update_of(tmp_path / "b" / "checkpoint_last.pt") == 4
    )
    assert "validation at update 4 cut short by the signal" in (tmp_path / "b" / "train.log").read_text()
    assert resume(tmp_path / "b").progress.update == 6
    a, b = (load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("a", "b"))
    assert a["ema"]["updates"] == b["ema"]["updates"] == 6
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        if key in a["ema"]["weights"]:
            assert torch.equal(a["ema"]["weights"][key], b["ema"]["weights"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert a["metrics"] == b["metrics"] and "val_bleu" in b["metrics"]


# ---------------------------------------------------------------- resuming when things changed
def test_resume_from_an_averaged_checkpoint_is_one_line(pairs64, spm_model, tmp_path, capsys):
    run = tmp_path / "run"
    train(config(pairs64, spm_model, run, "train.max_updates=2", "train.save_every=1"))
    run_cli(["average", run / "checkpoint_1.pt", run / "checkpoint_2.pt", "-o", tmp_path / "avg.pt"], capsys)
    avg_run = tmp_path / "avg_run"
    avg_run.mkdir()
    shutil.copyfile(tmp_path / "avg.pt", avg_run / "checkpoint_last.pt")
    capsys.readouterr()
    code, _, err = run_cli(["train", "--resume", avg_run], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert (
        f"{avg_run / 'checkpoint_last.pt'}: an averaged checkpoint (optimizer, scheduler, rng, progress missing)" in err
    )


def test_changed_optimizer_settings_are_applied_and_said(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    train(config(pairs64, spm_model, run, "train.max_updates=3"))
    saved = load_checkpoint(run / "checkpoint_last.pt")["optimizer"]
    trainer = Trainer(
        set_up(
            resumed_config(
                run, ["train.weight_decay=0.01", "train.optimizer_betas=[0.9, 0.99]", "train.optimizer_eps=1e-6"]
            ),
            resume=True,
        )
    )
    try:
        opt = trainer.optimizer
        assert isinstance(opt, torch.optim.AdamW)
        assert {g["weight_decay"] for g in opt.param_groups} == {
            0.01,
            0.0,
        }  # matrices decay; biases, norms, embeddings not
        assert all(g["betas"] == (0.9, 0.99) and g["eps"] == 1e-6 for g in opt.param_groups)
        # the moments carried over: every saved parameter state, by parameter
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        saved_moments = sorted(float(s["exp_avg_sq"].sum()) for s in saved["state"].values())
        assert sorted(float(opt.state[p]["exp_avg_sq"].sum()) for p in params) == pytest.approx(saved_moments)
    finally:
        trainer.close()
    log = (run / "train.log").read_text()
    for change in (
        "train.weight_decay: 0 -> 0.01",
        "train.optimizer_betas: [0.9, 0.98] -> [0.9, 0.99]",
        "train.optimizer_eps: 1e-09 -> 1e-06",
    ):
        assert f"resuming with {change}: applied from update 4 on" in log
    assert resume(run, "train.weight_decay=0.01", "train.max_updates=5").progress.update == 5


def test_changed_batching_restarts_the_epoch_and_says_so(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    result = train(config(pairs64, spm_model, run, "train.max_updates=3"))
    assert (
        result.progress.epoch == 1 and result.progress.batch_in_epoch == 3
    )  # 64 pairs in 300-token batches: mid-epoch
    trainer = Trainer(set_up(resumed_config(run, ["train.max_tokens=500"]), resume=True))
    assert trainer.progress.batch_in_epoch == 0 and trainer.progress.epoch == 1
    trainer.close()
    assert (
        "the batching changed since the checkpoint (max_tokens 300 -> 500): epoch 1 starts again"
        in (run / "train.log").read_text()
    )
    trainer = Trainer(set_up(resumed_config(run, []), resume=True))  # unchanged: the position holds
    assert trainer.progress.batch_in_epoch == 3
    trainer.close()


def test_validation_beam_beyond_the_vocabulary_is_refused_at_start(pairs64, spm_model, tmp_path):
    with pytest.raises(ConfigError, match="train.valid_beam=600: the target vocabulary has 1000 ids"):
        train(
            config(pairs64, spm_model, tmp_path / "run", "train.valid_beam=600", "train.valid_bleu_sentences=4"),
            on_update=lambda *_: pytest.fail("trained first"),
        )


# ---------------------------------------------------------------- the NaN guard's bound; metrics.jsonl after a resume
def test_nan_updates_stop_the_run_after_a_bounded_number(pairs64, spm_model, tmp_path, monkeypatch):
    monkeypatch.setattr(
        torch.nn.utils, "get_total_norm", lambda *_a, **_k: torch.tensor(float("nan"))
    )  # the norm the NaN guard reads
    run = tmp_path / "run"
    with pytest.raises(
        TrainError, match=f"diverged: the last {MAX_NONFINITE_UPDATES} updates all had a non-finite gradient norm"
    ):
        train(config(pairs64, spm_model, run, "train.max_updates=50", "train.save_every=1", "train.keep_last=0"))
    assert (
        MAX_NONFINITE_UPDATES == 10
        and update_of(run / "checkpoint_last.pt") == 10
        and not (run / "checkpoint_11.pt").exists()
    )
    first, last = (
        load_checkpoint(run / "checkpoint_1.pt")["model"],
        load_checkpoint(run / "checkpoint_last.pt")["model"],
    )
    assert all(
        torch.equal(first[k], last[k]) for k in first
    )  # every update was skipped: the saved model is the one before them
    assert "update 10: gradient norm is nan; update skipped" in (run / "train.log").read_text()


def test_metrics_jsonl_has_each_update_once_after_a_resume(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # killed at update 6: records 1-5 written, the last checkpoint is update 4
        train(
            config(pairs64, spm_model, run, "train.max_updates=8", "train.validate_every=4", "train.log_every=1"),
            on_update=stop_at(6),
        )
    resume(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if r["kind"] == "train"] == list(range(1, 9))
    assert [r["update"] for r in records if r["kind"] == "valid"] == [4, 8]


# ---------------------------------------------------------------- a full disk while logging names the log
def test_disk_full_while_logging_names_train_log(pairs64, spm_model, tmp_path, monkeypatch, capsys):
    real_init = RunLog.__init__

    class FullFile:
        def __init__(self, name):
            self.name = name

        def write(self, _text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

        close = flush

    def init(self, out_dir, **kwargs):
        real_init(self, out_dir, **kwargs)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = FullFile(str(Path(out_dir) / "train.log"))

    monkeypatch.setattr(RunLog, "__init__", init)
    run = tmp_path / "run"
    code, _, err = run_cli(
        ["train", "-c", write_config(tmp_path / "c.yaml", pairs64, spm_model, run, "train.max_updates=2")], capsys
    )
    assert (
        code == 2
        and err
        == f"tmt: error: {run / 'train.log'}: No space left on device; free some disk space or write elsewhere\n"
    )


# ---------------------------------------------------------------- SIGKILL at random moments, ten times
def _train_in_child(argv: list[str]) -> None:
    _own_tqdm_lock()
    from transformer_mt.cli import main

    try:
        main(argv)
    except SystemExit:
        pass
    os._exit(0)


def test_sigkill_at_random_moments_leaves_a_resumable_run(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml",
        pairs64,
        spm_model,
        run,
        "train.max_updates=100000",
        "train.save_every=1",
        "train.keep_last=3",
        "train.validate_every=7",
        "train.log_every=1",
    )
    rng = random.Random(17)
    fork = multiprocessing.get_context("fork")
    argv, newest = ["train", "-c", str(cfg)], 0
    for kill in range(10):
        child = fork.Process(target=_train_in_child, args=(argv,))
        child.start()
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and max((update_of_name(p) for p in run.glob("checkpoint_[0-9]*.pt")), default=0) <= newest
        ):
            time.sleep(0.01)  # until this process has saved a checkpoint of its own
        time.sleep(rng.uniform(0.0, 0.3))  # then a random moment: inside an update, a save, a validation, a prune
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL, f"kill {kill}: the child ended by itself ({child.exitcode})"
        found = sorted(run.glob("checkpoint*.pt"))
        states = {p.name: torch.load(p, weights_only=True) for p in found}  # every checkpoint on disk is complete
        updates = [s["progress"]["update"] for s in states.values()]
        assert updates and all(s["format"] == "transformer_mt/1" for s in states.values())
        assert max(updates) > newest, f"kill {kill}: no progress"
        newest = max(updates)
        argv = ["train", "--resume", str(run)]
    result = resume(run, f"train.max_updates={newest + 2}")  # the last resume runs to its end
    assert result.progress.update == newest + 2
    assert f"at update {newest}, epoch" in (run / "train.log").read_text().rsplit("resumed from", 1)[1]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if r["kind"] == "train"] == list(range(1, newest + 3))  # each once, none lost
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]  # the killed writers' leftovers were cleared


def update_of_name(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])
