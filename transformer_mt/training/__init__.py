"""The training loop and what it owns: train state, checkpoint policy, stopping, optimizer, EMA, logs; what trains
(LoRA adapters, frozen parts) and `tmt merge`."""

from transformer_mt.training.ema import EMA
from transformer_mt.training.finetuning import (
    TrainedShare,
    adapter_path,
    freeze_parts,
    merge_checkpoint,
    prepare_for_training,
)
from transformer_mt.training.optim import (
    Scheduler,
    budget_fraction,
    build_optimizer,
    build_scheduler,
    inverse_sqrt_lr,
    linear_lr,
    noam_lr,
    param_groups,
    wsd_lr,
)
from transformer_mt.training.policy import CheckpointPolicy, newest_checkpoint
from transformer_mt.training.run import Run, TrainError
from transformer_mt.training.run_config import resumed_config, train_config_from_cli
from transformer_mt.training.rundir import RunDirError, RunLock
from transformer_mt.training.runlog import RunLog
from transformer_mt.training.setup import set_up
from transformer_mt.training.state import Batching, Progress, TrainResult, TrainState
from transformer_mt.training.step import UpdateBatches, UpdateStats, target_tokens, update_schedule
from transformer_mt.training.stopping import MAX_NONFINITE_UPDATES, Stopping
from transformer_mt.training.tensorboard import TensorBoardLog
from transformer_mt.training.trainer import Trainer, train, train_from_cli

__all__ = [
    "EMA",
    "MAX_NONFINITE_UPDATES",
    "Batching",
    "CheckpointPolicy",
    "Progress",
    "Run",
    "RunDirError",
    "RunLock",
    "RunLog",
    "Scheduler",
    "Stopping",
    "TensorBoardLog",
    "TrainError",
    "TrainResult",
    "TrainedShare",
    "TrainState",
    "Trainer",
    "UpdateBatches",
    "UpdateStats",
    "adapter_path",
    "budget_fraction",
    "build_optimizer",
    "build_scheduler",
    "freeze_parts",
    "inverse_sqrt_lr",
    "linear_lr",
    "merge_checkpoint",
    "newest_checkpoint",
    "noam_lr",
    "param_groups",
    "prepare_for_training",
    "resumed_config",
    "set_up",
    "target_tokens",
    "train",
    "train_config_from_cli",
    "train_from_cli",
    "update_schedule",
    "wsd_lr",
]
