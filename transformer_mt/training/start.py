"""Where a run starts: a resume's checkpoint (the newest complete one, policy.newest_checkpoint), a fine-tuning run's
(train.init_from), or none; the weights taken from it checked before any model is built; and the run's tokenizers:
the checkpoint's, or for a new run trained or read from the config.

Data parallel (torchrun, WORLD_SIZE > 1): rank 0 picks the checkpoint a resume takes and every rank loads that one;
rank 0 alone trains the tokenizer (the others receive the models, not a path they may not see).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_mt import runtime
from transformer_mt.checkpoint import (
    config_from_checkpoint,
    load_checkpoint,
    model_weights,
    pack_tokenizer_pair,
    tokenizers_from_checkpoint,
)
from transformer_mt.config import Config
from transformer_mt.data import prepare_tokenizers
from transformer_mt.decoding.rebuild import check_fit
from transformer_mt.model import merge_lora_weights
from transformer_mt.text import Tokenizer
from transformer_mt.training.policy import newest_checkpoint

Log = Callable[[str], None]


def resume_point(out: Path, *, log: Log) -> tuple[Path, dict]:
    """The checkpoint a resume continues from and its state: rank 0 picks the newest complete one, the other ranks
    load the one it picked."""
    picked: list[tuple[Path, dict]] = []  # rank 0's pick, kept loaded: the file is read once

    def pick_on_main() -> str:
        picked.append(newest_checkpoint(out, log=log))
        return str(picked[0][0])

    path = Path(runtime.on_main(pick_on_main))
    state = picked[0][1] if picked else load_checkpoint(path, map_location="cpu")
    check_checkpoint_weights(state, source=path, weights=("raw",))  # a resume restores the EMA itself (training.ema)
    return path, state


def init_point(cfg: Config, *, log: Log) -> tuple[Path, dict] | None:
    """The checkpoint a fine-tuning run starts from (``train.init_from``) and its state, or None for a new model;
    its weights checked (:func:`check_checkpoint_weights`) before the line that says so is logged."""
    if not cfg.train.init_from:
        return None
    path = Path(cfg.train.init_from)
    state = load_checkpoint(path, map_location="cpu")
    check_checkpoint_weights(
        state, source=path, weights=(None,)
    )  # what initialize() loads: the EMA weights when present
    log(
        f"starting from the weights, architecture and tokenizer of {path} (train.init_from), with a fresh optimizer "
        "and schedule"
    )
    return path, state


def check_checkpoint_weights(state: dict, *, source: Path, weights: tuple[str | None, ...]) -> None:
    """The weights a run takes from a checkpoint (``weights``: as checkpoint.model_weights names them), checked
    against the model its config makes with its tokenizers before any model is built (decoding.rebuild.check_fit:
    the size bound, names, shapes and dtypes, the file's bytes)."""
    saved = config_from_checkpoint(state, source=str(source))
    src_tok, tgt_tok = tokenizers_from_checkpoint(state, saved, source=str(source))
    file_bytes = source.stat().st_size if source.is_file() else None
    for which in weights:
        chosen = model_weights(state, weights=which, source=str(source))
        chosen = merge_lora_weights(chosen, saved.model, saved.train.lora)  # base weights checked; adapters on load
        check_fit(
            saved.model,
            chosen,
            src_vocab_size=src_tok.vocab_size,
            tgt_vocab_size=tgt_tok.vocab_size,
            source=str(source),
            file_bytes=file_bytes,
        )


def tokenizers(cfg: Config, state: dict | None, *, source: str, log: Log) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers: a resumed run's own, or the checkpoint's a fine-tuning run starts from (``state``); for a new
    run rank 0 trains or reads them, and the other ranks get the models, not a path they may not see."""
    if state is None:
        state = {"tokenizers": runtime.on_main(functools.partial(_new_tokenizers, cfg, log=log))}
    return tokenizers_from_checkpoint(state, cfg, source=source)


def _new_tokenizers(cfg: Config, *, log: Log) -> dict[str, Any]:
    """Rank 0: a new run's tokenizers (data.prepare_tokenizers), packed as a checkpoint holds them."""
    return pack_tokenizer_pair(*prepare_tokenizers(cfg, log=log))
