"""The checkpoint policy of a run: which files a save writes, which validation is the best, what pruning
keeps, and which checkpoint a resume starts from.

- Names. Every save writes ``checkpoint_last.pt``, so a resume never goes back further than the last save.
  A validation that improves the best metric also writes ``checkpoint_best.pt``, before last: a kill
  between the two must not leave an older model as the best for good (the progress in last already counts
  this validation as the best). Numbered ``checkpoint_<update>.pt`` files come at multiples of
  train.save_every, or at every validation when it is 0 (`TrainConfig.writes_numbered`).
- Writing. The state is serialised once, written atomically under the first name and copied atomically to
  the others (checkpoint/io.py), so each name is complete whenever it exists. After a numbered one, the
  oldest numbered files beyond train.keep_last are pruned, keeping multiples of train.keep_every
  (checkpoint/retention.py).
- Resume. Checkpoints are written atomically, so each file is complete or absent; a resume takes the newest
  that loads: ``checkpoint_last.pt`` or a numbered ``checkpoint_<update>.pt`` of a later update (a kill
  between writing the two), skipping any that does not load. A checkpoint without training state (an
  average) cannot be resumed, and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import (
    CheckpointError,
    checkpoint_update,
    copy_checkpoint,
    load_checkpoint,
    numbered_checkpoint_path,
    numbered_checkpoints,
    prune_checkpoints,
    save_checkpoint,
)
from transformer_mt.config import TrainConfig
from transformer_mt.training.finetuning import adapter_path, adapter_state
from transformer_mt.training.rundir import RunDirError

LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"


class CheckpointPolicy:
    """Where and when one run saves, and what it keeps."""

    def __init__(self, out_dir: str | os.PathLike, t: TrainConfig):
        self.out, self.t = Path(out_dir), t

    def score(self, val: dict[str, float]) -> tuple[float, bool]:
        """The metric that chooses checkpoint_best.pt (train.best_metric; BLEU only when this validation has it)
        and whether higher is better."""
        if self.t.best_metric == "bleu" and "val_bleu" in val:
            return val["val_bleu"], True
        return val["val_loss"], False

    def improves(self, val: dict[str, float], best: float | None) -> bool:
        metric, higher_better = self.score(val)
        return best is None or (metric > best if higher_better else metric < best)

    def after_validation(self, update: int, *, improved: bool) -> list[Path]:
        """The files a validation's save writes, in order: best (when improved), numbered (when due), last."""
        numbered = self.t.writes_numbered(update, validating=True)
        return (
            [self.out / BEST] * improved + [numbered_checkpoint_path(self.out, update)] * numbered + [self.out / LAST]
        )

    def between_validations(self, update: int) -> list[Path]:
        """The files a save between validations writes: numbered and last when one is due, else none."""
        if not self.t.writes_numbered(update, validating=False):
            return []
        return [numbered_checkpoint_path(self.out, update), self.out / LAST]

    def at_end(self) -> list[Path]:
        """The save of a stopping run (limits reached, a signal, divergence)."""
        return [self.out / LAST]

    def save(self, state: dict[str, Any], paths: list[Path]) -> None:
        """`state` under each of `paths` in order (see the module docstring), then pruning after a numbered one."""
        first = save_checkpoint(state, paths[0])
        for path in paths[1:]:
            copy_checkpoint(first, path)
        adapters = adapter_state(state)  # a LoRA run's adapters and their config, written beside each checkpoint too
        if adapters is not None:
            for path in paths:
                save_checkpoint(adapters, adapter_path(path))
        if any(path.name not in (LAST, BEST) for path in paths):
            pruned = prune_checkpoints(self.out, self.t.keep_last, keep_every=self.t.keep_every)
            for path in pruned:
                adapter_path(path).unlink(missing_ok=True)


def newest_checkpoint(
    run_dir: str | os.PathLike, *, log: Callable[[str], None] | None = None
) -> tuple[Path, dict[str, Any]]:
    """The newest complete training checkpoint of a run and its loaded state (see the module docstring).
    ``log`` hears about each checkpoint skipped because it does not load."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise RunDirError(
            f"--resume {run_dir}: give the run directory (train.out_dir), not a checkpoint file; the newest checkpoint "
            "in it is found for you"
        )
    if not run_dir.is_dir():
        raise RunDirError(f"--resume {run_dir}: no such run directory; give the train.out_dir of the run to continue")

    def load(path: Path) -> dict[str, Any] | None:
        try:
            return load_checkpoint(path)
        except CheckpointError as exc:
            if log is not None:
                log(f"skipping {path.name}: {exc}")
            return None

    last_path = run_dir / LAST
    last = load(last_path) if last_path.is_file() else None
    last_update = _update_of(last)
    for path in reversed(numbered_checkpoints(run_dir)):  # newest first; those after the last one (killed in between)
        if checkpoint_update(path) <= last_update:
            break
        state = load(path)
        if state is not None:
            return path, _resumable(path, state)
    if last is not None:
        return last_path, _resumable(last_path, last)
    raise RunDirError(
        f"--resume {run_dir}: no checkpoint to resume from (no complete checkpoint_last.pt or checkpoint_<update>.pt); "
        "check the directory, or start a new run with --config"
    )


def _update_of(state: dict[str, Any] | None) -> int:
    progress = (state or {}).get("progress")
    return int(progress.get("update", -1)) if isinstance(progress, dict) else -1


def _resumable(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    missing = [key for key in ("optimizer", "scheduler", "rng", "progress") if state.get(key) is None]
    if missing:
        what = "an averaged checkpoint" if "averaged_from" in state else "a checkpoint without training state"
        raise RunDirError(
            f"{path}: {what} ({', '.join(missing)} missing) holds weights only, so training cannot continue from it; "
            f"resume a run directory written by `tmt train`, or start a new run"
        )
    return state
