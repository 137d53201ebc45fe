"""A run as the training loop receives it: `Run`, everything `setup.set_up` built, in one typed object, and how it is
closed; and `main_rank_work`, around what rank 0 alone does in a data-parallel run.

Data parallel (torchrun, WORLD_SIZE > 1): every rank holds a `Run`. Rank 0 alone holds the run directory's lock and
writes into it (train.log, metrics.jsonl, config.yaml, checkpoints); the other ranks' `RunDir` holds no lock and their
`RunLog` writes nothing, so the loop logs unconditionally.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, TrainConfig
from transformer_mt.data import ValidationSet
from transformer_mt.errors import TmtError
from transformer_mt.model.ops.compiling import Compiler
from transformer_mt.training.policy import CheckpointPolicy
from transformer_mt.training.rundir import RunDir
from transformer_mt.training.runlog import RunLog
from transformer_mt.training.state import TrainState
from transformer_mt.training.step import Corpus
from transformer_mt.training.validation import Validator


class TrainError(TmtError, RuntimeError):
    """A training problem worded for the user."""


@dataclass
class RunData:
    """What a run trains and validates on."""

    train: Corpus  # the training pairs (several corpora mixed by weight), re-segmented every epoch with subword_alpha
    valid: list[ValidationSet] | None  # the checked validation sets; None without one
    validator: Validator | None  # validates the model on them


@dataclass
class Run:
    """One training run, set up (setup.set_up) and handed to the Trainer: its config, directory, logs, train state,
    data, the module the training forward runs, and its checkpoint policy. `close()` releases what it holds."""

    cfg: Config  # as given, and saved in checkpoints (train.dtype "auto" stays "auto")
    t: TrainConfig  # what this process trains with: cfg.train with the dtype resolved
    dist: runtime.DistInfo  # this process's place in a data-parallel job
    device: torch.device
    owns_group: bool  # this process created the process group, and leaves it on close()
    run_dir: RunDir
    runlog: RunLog  # train.log, metrics.jsonl and TensorBoard; silent on ranks other than 0
    state: TrainState  # tokenizers, model, optimizer, schedule, scaler, EMA, progress: what a checkpoint holds
    data: RunData
    train_model: torch.nn.Module  # the loss module around the model, DDP-wrapped in a data-parallel run
    policy: CheckpointPolicy  # which files a save writes, which validation is the best, what pruning keeps
    resumed_from: Path | None = None  # the checkpoint a resumed run continues from
    compiler: Compiler | None = None  # what train.compile compiled (its graphs, for the log's last lines); None: off

    @property
    def is_main(self) -> bool:
        """Rank 0 (or the only process): it validates and writes the run directory."""
        return self.dist.is_main

    @property
    def out(self) -> Path:
        return self.run_dir.path

    def log(self, msg: str) -> None:
        """A line of train.log (and stderr), on rank 0."""
        self.runlog.log(msg)

    def close(self) -> None:
        """Close the run log, leave the process group this process created, and release the run directory.
        Closing twice does nothing more."""
        self.runlog.close()
        # Drop DDP first: were its reducer the last holder of the Gloo group, the group's destructor
        # would wait for Gloo's threads while holding the GIL they may need (a deadlock at exit).
        self.train_model = self.state.model
        if self.owns_group:
            runtime.shutdown_distributed()
            self.owns_group = False
        self.run_dir.release()


@contextlib.contextmanager
def main_rank_work() -> Iterator[None]:
    """Around a block that only rank 0 enters (``if run.is_main:``): the other ranks wait here until rank 0 is
    through it, and a failure in it raises on every rank (rank 0 its own error, the others runtime.DistributedError),
    as runtime.on_main does, so that no rank waits for one that stopped. Without a process group, nothing more."""
    failure: Exception | None = None
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - raised again below, on every rank
        failure = exc
    runtime.on_main(functools.partial(_raise_if_any, failure))


def _raise_if_any(failure: Exception | None) -> None:
    if failure is not None:
        raise failure
