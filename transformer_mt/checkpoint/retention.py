"""The numbered checkpoints of a run directory: their names, which exist, and pruning.

A run directory keeps ``checkpoint_last.pt``, ``checkpoint_best.pt`` and numbered ``checkpoint_<update>.pt``
files (one save may write the same bytes under several of these names: ``io.copy_checkpoint``);
:func:`prune_checkpoints` deletes the oldest numbered ones (but those at multiples of ``train.keep_every``),
and :func:`last_checkpoints` picks those `tmt average` reads. When a run writes which of them is the
training loop's checkpoint policy (training/policy.py).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from transformer_mt.checkpoint.io import CheckpointError

_NUMBERED = re.compile(r"checkpoint_(\d+)\.pt")


def numbered_checkpoint_path(out_dir: str | os.PathLike, update: int) -> Path:
    """``<out_dir>/checkpoint_<update>.pt``."""
    if update < 0:
        raise CheckpointError(f"update {update} is negative; numbered checkpoints are named by the update count")
    return Path(out_dir) / f"checkpoint_{update}.pt"


def is_numbered_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as a run's ``checkpoint_<update>.pt``."""
    return _NUMBERED.fullmatch(Path(path).name) is not None


def numbered_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The run's ``checkpoint_<update>.pt`` files, oldest first (sorted by update, not by name)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir() if (m := _NUMBERED.fullmatch(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def checkpoint_update(path: str | os.PathLike) -> int:
    """The update number in a ``checkpoint_<update>.pt`` name."""
    match = _NUMBERED.fullmatch(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path}: not a numbered checkpoint_<update>.pt file")
    return int(match.group(1))


def prune_checkpoints(out_dir: str | os.PathLike, keep_last: int, *, keep_every: int = 0) -> list[Path]:
    """Delete all but the ``keep_last`` newest numbered checkpoints (0 = keep all); returns the deleted.
    With ``keep_every`` > 0, those whose update is a multiple of it are kept too (LAWA-style averaging
    over a wider window: ``tmt average --every``).

    ``checkpoint_best.pt``, ``checkpoint_last.pt`` and anything not named ``checkpoint_<int>.pt``
    are never touched.
    """
    if keep_last < 0 or keep_every < 0:
        raise CheckpointError(
            f"keep_last={keep_last}, keep_every={keep_every}: negative; use 0 (keep all / none) or a positive count"
        )
    found = numbered_checkpoints(out_dir)
    doomed = found[:-keep_last] if keep_last else []
    if keep_every:
        doomed = [p for p in doomed if checkpoint_update(p) % keep_every]
    for path in doomed:
        with contextlib.suppress(FileNotFoundError):  # a concurrent prune got there first
            path.unlink()
    return doomed


def last_checkpoints(run_dir: str | os.PathLike, n: int, *, every: int = 0) -> list[Path]:
    """The ``n`` newest numbered checkpoints of a run, oldest first (so the newest is last); with ``every``
    > 0, the newest of those whose update is a multiple of ``every``."""
    if n < 1:
        raise CheckpointError(f"cannot take the last {n} checkpoints; ask for at least 1")
    if every < 0:
        raise CheckpointError(
            f"--every {every} is negative; give the spacing in updates (e.g. 1000), or 0 for the newest checkpoints"
        )
    found = numbered_checkpoints(run_dir)
    if every:
        found = [p for p in found if checkpoint_update(p) % every == 0]
        if len(found) < n:
            updates = ", ".join(str(checkpoint_update(p)) for p in found) or "none"
            raise CheckpointError(
                f"{run_dir}: asked for the last {n} checkpoints at multiples of {every} updates but found {len(found)} "
                f"(updates: {updates}); ask for fewer with --last, or train with train.keep_every={every} (and "
                "numbered saves on those updates) so pruning keeps them"
            )
    if len(found) < n:
        raise CheckpointError(
            f"{run_dir}: asked for the last {n} checkpoints but the run has {len(found)} numbered "
            "checkpoint_<update>.pt files; ask for fewer or raise train.keep_last for the next run"
        )
    return found[-n:]
