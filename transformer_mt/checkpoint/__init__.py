"""Checkpoint files: atomic save, safe load, retention and averaging."""

from transformer_mt.checkpoint.io import (
    FORMAT,
    CheckpointError,
    average_checkpoints,
    config_from_checkpoint,
    copy_checkpoint,
    last_checkpoints,
    load_checkpoint,
    model_weights,
    numbered_checkpoint_path,
    numbered_checkpoints,
    pack_tokenizers,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unpack_tokenizers,
)

__all__ = [
    "CheckpointError",
    "FORMAT",
    "average_checkpoints",
    "config_from_checkpoint",
    "copy_checkpoint",
    "last_checkpoints",
    "load_checkpoint",
    "model_weights",
    "numbered_checkpoint_path",
    "numbered_checkpoints",
    "pack_tokenizers",
    "prune_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "unpack_tokenizers",
]
