"""Checkpoint files: the format, atomic save and safe load (io), the tokenizers and config a checkpoint holds
(entries), the weights to decode with (weights), RNG state (rng), the numbered files of a run and their pruning
(retention), averaging (averaging), the directories `tmt export` writes (exports), and the interface of a format's
converter to and from a checkpoint (converter)."""

from transformer_mt.checkpoint.averaging import average_checkpoints, check_average_output
from transformer_mt.checkpoint.converter import Exporter, Importer
from transformer_mt.checkpoint.entries import (
    config_from_checkpoint,
    pack_tokenizer_pair,
    pack_tokenizers,
    tokenizers_from_checkpoint,
    unpack_tokenizers,
    unpack_vocabularies,
)
from transformer_mt.checkpoint.exports import (
    EXPORT_MARKER,
    file_sha256,
    output_problem,
    staged_directory,
    write_export_marker,
)
from transformer_mt.checkpoint.io import FORMAT, CheckpointError, copy_checkpoint, load_checkpoint, save_checkpoint
from transformer_mt.checkpoint.retention import (
    checkpoint_update,
    last_checkpoints,
    numbered_checkpoint_path,
    numbered_checkpoints,
    prune_checkpoints,
)
from transformer_mt.checkpoint.rng import rng_state, set_rng_state
from transformer_mt.checkpoint.weights import model_weights

__all__ = [
    "CheckpointError",
    "EXPORT_MARKER",
    "Exporter",
    "FORMAT",
    "Importer",
    "average_checkpoints",
    "check_average_output",
    "checkpoint_update",
    "config_from_checkpoint",
    "copy_checkpoint",
    "file_sha256",
    "last_checkpoints",
    "load_checkpoint",
    "model_weights",
    "numbered_checkpoint_path",
    "numbered_checkpoints",
    "output_problem",
    "pack_tokenizer_pair",
    "pack_tokenizers",
    "prune_checkpoints",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "staged_directory",
    "tokenizers_from_checkpoint",
    "unpack_tokenizers",
    "unpack_vocabularies",
    "write_export_marker",
]
