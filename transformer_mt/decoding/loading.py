"""A checkpoint's model rebuilt for decoding: :func:`model_from_checkpoint` reads a checkpoint, checks its
tokenizers (against an ensemble's first member, and that they hold a multilingual model's language tags) and its
position table against the bound, and rebuilds the model
(:mod:`~transformer_mt.decoding.rebuild` checks every stored tensor before anything is allocated).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from transformer_mt.checkpoint import (
    config_from_checkpoint,
    load_checkpoint,
    model_weights,
    tokenizers_from_checkpoint,
    unpack_tokenizers,
    unpack_vocabularies,
)
from transformer_mt.config import MAX_POSITION_TABLE_BYTES, Config
from transformer_mt.decoding.lengths import positions_needed
from transformer_mt.decoding.rebuild import rebuild_model
from transformer_mt.decoding.results import TranslateError
from transformer_mt.model import Transformer, merge_lora_weights
from transformer_mt.text import SpecialIds, Tokenizer, is_multilingual, language_tag, target_languages


class CheckpointModel(NamedTuple):
    """The model a checkpoint holds, rebuilt on the CPU in float32, with its config and tokenizers."""

    model: Transformer
    cfg: Config
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    source: str  # the checkpoint's path, for messages


def model_from_checkpoint(
    path: str | os.PathLike, *, weights: str | None = None, tokenizers_of: CheckpointModel | None = None
) -> CheckpointModel:
    """Rebuild a checkpoint's model with ``weights`` "ema", "raw" or None (its EMA weights when it has them,
    what `tmt translate` decodes with; checkpoint.model_weights). With ``tokenizers_of`` (an ensemble's first
    member), the checkpoint must hold the same tokenizers, checked before the model is built, and shares that
    member's. Nothing is allocated for the model before its config, its tokenizers' sizes and its stored tensors
    agree and fit in the file and in memory (:mod:`~transformer_mt.decoding.rebuild`); the tensors are mapped
    from the file, not read, until then."""
    state = load_checkpoint(path, mmap=True)
    cfg = config_from_checkpoint(state, source=str(path))
    if tokenizers_of is None:
        src_tok, tgt_tok = tokenizers_from_checkpoint(state, cfg, source=str(path))
        # a multilingual model's sources start with a language tag: one piece of its tokenizer, checked once here
        # (an NLLB model's start with its codes instead, checked when a translation names them)
        tagged = is_multilingual(cfg.data) and not cfg.model.decoder_languages
        languages = target_languages(cfg.data) if tagged else []
        src_tok.tag_ids([language_tag(lang) for lang in languages], where=str(path))
    else:
        src_tok, tgt_tok = tokenizers_of.src_tok, tokenizers_of.tgt_tok
        differ = [
            what
            for what, mine, theirs in (
                ("sentencepiece models", unpack_tokenizers(state, source=str(path)), (src_tok.proto, tgt_tok.proto)),
                ("vocabularies", unpack_vocabularies(state, source=str(path)), (src_tok.vocab, tgt_tok.vocab)),
                ("special ids (model.*_id)", SpecialIds.of(cfg.model), tokenizers_of.model.specials),
            )
            if mine != theirs
        ]
        if differ:
            raise TranslateError(
                f"{path}: its {differ[0]} differ from those of {tokenizers_of.source}; "
                "an ensemble needs checkpoints trained with the same tokenizer"
            )
        if target_languages(cfg.data) != target_languages(tokenizers_of.cfg.data):
            raise TranslateError(
                f"{path}: its target languages (data.corpora) differ from those of {tokenizers_of.source}; "
                "an ensemble needs checkpoints trained into the same languages"
            )
    weights_dict = model_weights(state, weights=weights, source=str(path))
    # LoRA adapters merged at load: the plain model decodes at its own speed, on every fast path, and exports as is
    weights_dict = merge_lora_weights(weights_dict, cfg.model, cfg.train.lora)
    # the table a Translator sizes for the longest source and output, refused before the model's own is built
    check_position_table(
        cfg, positions_needed(cfg.model.max_positions, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b)
    )
    model = rebuild_model(
        cfg.model,
        weights_dict,
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        source=str(path),
        file_bytes=os.path.getsize(path),
    )
    return CheckpointModel(model, cfg, src_tok, tgt_tok, str(path))


def check_position_table(cfg: Config, positions: int) -> None:
    """Refuse, before allocating it, a sinusoid table (positions x d_model float32) over
    :data:`MAX_POSITION_TABLE_BYTES`: each of model.max_positions, decode.max_len_a and decode.max_len_b
    may be within its bound while together they ask for tens of GB."""
    size = positions * cfg.model.d_model * 4
    if cfg.model.positions == "sinusoidal" and size > MAX_POSITION_TABLE_BYTES:
        m, d = cfg.model, cfg.decode
        raise TranslateError(
            f"model.max_positions={m.max_positions} with decode.max_len_a={d.max_len_a:g} and "
            f"decode.max_len_b={d.max_len_b} need a position table of {positions:,} x {m.d_model} "
            f"({size / (1 << 30):.1f} GiB, more than {MAX_POSITION_TABLE_BYTES >> 30} GiB); lower them in the "
            "checkpoint's config (the longest output is max_len_a x source length + max_len_b)"
        )
