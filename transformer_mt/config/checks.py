"""Validation of a whole :class:`Config`: choices, ranges, cross-section rules, allocation bounds, files.

Each section's checks are one function; :func:`validate` runs them in order and raises
:class:`ConfigError` on the first impossible value, as ``<source>: <section.key>: <what and the fix>``.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from transformer_mt.config.corpora import check_coded_pairs, check_corpora, check_valid_sets, data_files
from transformer_mt.config.rules import (
    beam_problem,
    length_problem,
    lenpen_problem,
    sampling_problem,
    specials_problem,
)
from transformer_mt.config.sections import (
    LORA_TARGETS,
    Config,
    DataConfig,
    DecodeConfig,
    FreezeConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
)
from transformer_mt.errors import TmtError


class ConfigError(TmtError, ValueError):
    """A configuration mistake, worded for the user (one line, names the key and the fix)."""


Fail = Callable[[str, str], NoReturn]  # fail(dotted key, message): raises ConfigError naming the source

CHOICES = {
    "tokenizer.model_type": ("unigram", "bpe"),
    "model.activation": ("relu", "gelu", "swish"),
    "model.norm": ("post", "pre", "scale"),
    "model.positions": ("sinusoidal", "learned"),
    "model.position_layout": ("interleaved", "halves", "fairseq"),
    "train.dtype": ("float32", "bfloat16", "float16", "auto"),
    "train.ops": ("auto", "reference", "cpu", "cuda"),  # transformer_mt.model.ops.OPS_CHOICES
    "train.lr_schedule": ("noam", "inverse_sqrt", "linear", "wsd"),
    "train.best_metric": ("bleu", "loss"),
    "train.compile": ("auto", "on", "aot_eager", "off"),
    "train.compile_mode": ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"),
    "train.packed": ("auto", "on", "off"),
    "data.filters.duplicates": ("off", "exact", "normalized"),
}
PATH_KEYS = (
    "data.train_src",
    "data.train_tgt",
    "data.valid_src",
    "data.valid_tgt",
    "tokenizer.model",
    "tokenizer.tgt_model",
    "train.init_from",
)


# Values in messages come from files that anyone may have written: a repr of bounded nesting, items and length.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset, _REPR.maxstring, _REPR.maxother = (
    2,
    4,
    4,
    3,
    3,
    60,
    60,
)
_PLAIN = (str, int, float, bool, type(None), list, tuple, dict)


def quote(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a one-line message: at most ``limit`` characters, nesting and lengths bounded (an alias
    bomb or a list of millions is never expanded), no newline, and only the type of anything but plain data."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 10_000:
        text = f"<an integer of {value.bit_length()} bits>"  # repr() of one over 4300 digits raises
    elif type(value) not in _PLAIN:
        text = f"<a {type(value).__name__}>"
    else:
        try:
            text = _REPR.repr(value)
        except ValueError:  # an enormous integer inside a list
            text = f"<a {type(value).__name__}>"
    text = re.sub(r"\s*\n\s*", " ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quote_name(name: Any, limit: int = 80) -> str:
    """A name read from a file (a key, a tensor's name) as a message shows it: as it is when it is a short printable
    string, else quoted by :func:`quote` (a tab, a line separator or a thousand characters never reach the
    message raw)."""
    if isinstance(name, str) and name.isprintable() and len(name) <= limit:
        return name
    return quote(name, limit)


def validate(cfg: Config, *, source: str = "config", check_files: bool = True) -> None:
    """Raise ConfigError on the first impossible value."""

    def fail(key: str, msg: str) -> NoReturn:
        raise ConfigError(f"{source}: {key}: {msg}")

    for dotted, allowed in CHOICES.items():
        value: Any = cfg
        for name in dotted.split("."):
            value = getattr(value, name)
        if value not in allowed:
            fail(dotted, f"{quote(value)} is not one of {', '.join(allowed)}")
    _check_model(cfg.model, fail)
    _check_tokenizer(cfg.tokenizer, cfg.model, fail)
    _check_train(cfg.train, fail)
    _check_finetuning(cfg.train, cfg.model, fail)
    _check_decode(cfg.decode, fail)
    _check_data(cfg.data, cfg.model, fail)
    if cfg.model.decoder_languages:
        check_coded_pairs(cfg.data, cfg.model.decoder_languages.split(), fail, init_from=cfg.train.init_from)
    check_corpora(cfg.data, fail)
    check_valid_sets(cfg.data, fail)
    _check_filters(cfg.data, fail)
    _check_bounds(cfg, fail)
    if check_files:
        paths = [(dotted, getattr(getattr(cfg, dotted.split(".")[0]), dotted.split(".")[1])) for dotted in PATH_KEYS]
        for dotted, value in paths + data_files(cfg.data):
            if value and not Path(value).is_file():
                fail(
                    dotted,
                    f"file {quote(value, 160)} not found; "
                    "check the path (relative paths start from the current directory)",
                )


def _check_model(m: ModelConfig, fail: Fail) -> None:
    for key in ("encoder_layers", "decoder_layers", "d_model", "heads", "d_ff", "max_positions"):
        if getattr(m, key) < 1:
            fail(f"model.{key}", f"must be at least 1, got {getattr(m, key)}")
    if not 0 <= m.position_offset <= 1024:
        fail("model.position_offset", f"{m.position_offset} is outside 0..1024; use 0, or 2 for M2M100 / NLLB models")
    if m.position_offset and m.positions != "sinusoidal":
        fail("model.position_offset", "offsets sinusoids only; remove it or set model.positions: sinusoidal")
    for key in ("head_dim", "value_dim"):
        if getattr(m, key) < 0:
            fail(f"model.{key}", f"must be 0 (= d_model / heads) or positive, got {getattr(m, key)}")
    if (m.head_dim == 0 or m.value_dim == 0) and m.d_model % m.heads:
        fail(
            "model.d_model",
            f"{m.d_model} is not divisible by model.heads={m.heads}; "
            "choose d_model as a multiple of heads (or set model.head_dim and model.value_dim)",
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= getattr(m, key) < 1.0:
            fail(f"model.{key}", f"{getattr(m, key)} is outside [0, 1); use e.g. 0.1")
    if m.positions == "learned" and m.position_layout != "interleaved":
        fail(
            "model.position_layout",
            f"{m.position_layout!r} orders sinusoids only; remove it or set model.positions: sinusoidal",
        )
    problem = specials_problem(m)
    if problem:
        fail(problem.key, f"{problem.value} {problem.reason}")


def _check_tokenizer(tok: TokenizerConfig, m: ModelConfig, fail: Fail) -> None:
    if m.share_all_embeddings and not tok.joint:
        fail(
            "model.share_all_embeddings",
            "needs a joint vocabulary; set tokenizer.joint: true or model.share_all_embeddings: false",
        )
    if tok.vocab_size < 8:
        fail("tokenizer.vocab_size", f"{tok.vocab_size} is too small; use at least a few thousand for real data")
    if not 0.0 < tok.character_coverage <= 1.0:
        fail("tokenizer.character_coverage", f"{tok.character_coverage} must be in (0, 1]; use 1.0 or 0.9995")


def _check_train(t: TrainConfig, fail: Fail) -> None:
    if not 0.0 <= t.label_smoothing < 1.0:
        fail("train.label_smoothing", f"{t.label_smoothing} is outside [0, 1); the paper uses 0.1")
    for key in ("max_tokens", "update_freq", "validate_every", "log_every"):
        if getattr(t, key) < 1:
            fail(f"train.{key}", f"must be at least 1, got {getattr(t, key)}")
    never_negative = (
        "max_updates",
        "max_epochs",
        "max_time",
        "save_every",
        "keep_last",
        "keep_every",
        "patience",
        "warmup_updates",
        "weight_decay",
        "pad_to_multiple",
    )
    for key in (*never_negative, "clip_norm", "threads"):
        if getattr(t, key) < 0:
            fail(f"train.{key}", f"must be 0 or positive, got {getattr(t, key)}")
    spacing = t.numbered_spacing
    if t.keep_every and t.keep_every % spacing:
        nearest = spacing * max(1, round(t.keep_every / spacing))
        fail(
            "train.keep_every",
            f"{t.keep_every} is not a multiple of "
            f"train.{'save_every' if t.save_every else 'validate_every'} ({spacing}), "
            "so only the updates that are multiples of both would be kept; "
            f"use a multiple of {spacing}, e.g. {nearest}",
        )
    _check_schedule(t, fail)
    if not 0.0 <= t.ema_decay < 1.0:
        fail("train.ema_decay", f"{t.ema_decay} is outside [0, 1); use 0 (off) or e.g. 0.999")
    if not all(0.0 <= b < 1.0 for b in t.optimizer_betas):
        fail("train.optimizer_betas", f"{t.optimizer_betas} must both be in [0, 1); the paper uses [0.9, 0.98]")
    problem = beam_problem(t.valid_beam)
    if problem:
        fail("train.valid_beam", f"{problem.value} {problem.reason}")


def _check_finetuning(t: TrainConfig, m: ModelConfig, fail: Fail) -> None:
    """train.lora and train.freeze: the adapters' rank, scale, dropout and targets; the parts to keep."""
    lora, freeze = t.lora, t.freeze
    if lora.rank < 0:
        fail("train.lora.rank", f"{lora.rank} is negative; use 0 (off) or a small rank such as 8")
    if lora.alpha <= 0:
        fail("train.lora.alpha", f"{lora.alpha:g} must be positive; use e.g. 16 (the update is scaled by alpha / rank)")
    if not 0.0 <= lora.dropout < 1.0:
        fail("train.lora.dropout", f"{lora.dropout:g} is outside [0, 1); use 0 or e.g. 0.05")
    for target in lora.targets:
        if target not in LORA_TARGETS:
            fail("train.lora.targets", f"{quote(target)} is not one of {', '.join(LORA_TARGETS)}")
    if lora.rank > 0 and not lora.targets:
        fail("train.lora.targets", f"is empty; name the projections to adapt, e.g. q,v (of {', '.join(LORA_TARGETS)})")
    if len(set(lora.targets)) != len(lora.targets):
        fail("train.lora.targets", "names a projection twice; name each once")
    for key in ("encoder_layers", "decoder_layers"):
        if not 0 <= getattr(freeze, key) <= getattr(m, key):
            fail(
                f"train.freeze.{key}",
                f"{getattr(freeze, key)} is outside [0, model.{key}={getattr(m, key)}]; use 0 (none) up to all of them",
            )
    if lora.rank > 0 and freeze != FreezeConfig():
        fail(
            "train.freeze",
            "applies without train.lora only: LoRA already keeps every weight but its adapters; "
            "remove train.freeze or set train.lora.rank: 0",
        )


def _check_schedule(t: TrainConfig, fail: Fail) -> None:
    for key in ("lr", "lr_scale"):
        if getattr(t, key) <= 0:
            fail(f"train.{key}", f"must be positive, got {getattr(t, key):g}")
    if t.lr_schedule == "inverse_sqrt" and t.warmup_updates < 1:
        fail("train.warmup_updates", "inverse_sqrt needs warmup_updates >= 1")
    if t.lr_schedule == "linear" and t.max_updates <= t.warmup_updates:
        fail(
            "train.max_updates",
            f"lr_schedule linear decays to 0 at max_updates, which must be above warmup_updates "
            f"(got max_updates={t.max_updates}, warmup_updates={t.warmup_updates}); set train.max_updates",
        )
    if t.lr_schedule == "wsd" and not (t.max_time or t.max_updates):
        fail(
            "train.lr_schedule",
            "wsd cools down over the end of the budget; set train.max_time (minutes) or train.max_updates",
        )
    if not 0.0 < t.cooldown <= 1.0:
        fail("train.cooldown", f"{t.cooldown} is outside (0, 1]; use e.g. 0.2 (the last fifth of the budget)")


def _check_decode(d: DecodeConfig, fail: Fail) -> None:
    # with sample, nbest counts independent samples: any number of them, whatever the beam (which is not used)
    problem = (
        beam_problem(d.beam, 1 if d.sample else d.nbest)
        or lenpen_problem(d.lenpen)
        or length_problem(d.max_len_a, d.max_len_b)
        or sampling_problem(temperature=d.temperature, top_k=d.top_k, top_p=d.top_p, epsilon=d.epsilon, seed=d.seed)
    )
    if problem:
        fail(f"decode.{problem.key}", f"{problem.value} {problem.reason}")
    if d.nbest < 1:
        fail("decode.nbest", f"{d.nbest} is out of range; use 1 or more")
    if d.batch_tokens < 1:
        fail("decode.batch_tokens", "must be at least 1")


def _check_data(data: DataConfig, m: ModelConfig, fail: Fail) -> None:
    if not 0.0 <= data.subword_alpha <= 1.0:
        fail(
            "data.subword_alpha",
            f"{data.subword_alpha} is outside [0, 1]; use 0 (off), 0.1-0.5 for unigram or about 0.1 for bpe",
        )
    if data.subword_nbest != -1 and data.subword_nbest < 2:
        fail("data.subword_nbest", f"{data.subword_nbest} samples nothing; use -1 (all segmentations) or at least 2")
    if data.max_len < 1:
        fail("data.max_len", f"must be at least 1, got {data.max_len}")
    if data.max_len_ratio < 1.0:
        fail(
            "data.max_len_ratio",
            f"{data.max_len_ratio:g} is below 1; a longer side is at least 1 times the shorter (e.g. 3)",
        )
    if data.max_len + 1 > m.max_positions:  # + EOS on the source, + BOS on the decoder input
        fail(
            "data.max_len",
            f"{data.max_len} + 1 (EOS or BOS) exceeds model.max_positions={m.max_positions}; "
            "lower data.max_len or raise model.max_positions",
        )
    if data.sampling_temperature < 0:
        fail("data.sampling_temperature", f"{data.sampling_temperature:g} is negative; use 0 (by weight) or T > 0")
    if bool(data.valid_src) != bool(data.valid_tgt):
        given, missing = ("valid_src", "valid_tgt") if data.valid_src else ("valid_tgt", "valid_src")
        fail(
            f"data.{missing}",
            f"is empty while data.{given} is set; give both validation files, or neither to train without validation",
        )


def _check_filters(data: DataConfig, fail: Fail) -> None:
    """data.filters: the cleaning rules' limits (transformer_mt.cleaning); 0 turns each off."""
    f = data.filters
    for key in ("min_words", "max_words"):
        if getattr(f, key) < 0:
            fail(f"data.filters.{key}", f"{getattr(f, key)} is negative; use 0 (off) or a number of words")
    if f.min_words and f.max_words and f.max_words < f.min_words:
        fail(
            "data.filters.max_words",
            f"{f.max_words} is below data.filters.min_words={f.min_words}, so no pair could pass; raise it",
        )
    if not (f.max_ratio == 0 or f.max_ratio >= 1):
        fail("data.filters.max_ratio", f"{f.max_ratio:g} is below 1; use 0 (off) or a ratio such as 3")
    for key in ("max_nonletter", "langid_min_prob"):
        if not 0 <= getattr(f, key) <= 1:
            fail(f"data.filters.{key}", f"{getattr(f, key):g} is outside [0, 1]; use 0 (off) or a share such as 0.5")
    if f.langid_min_prob and not f.langid:
        fail("data.filters.langid_min_prob", "applies only with data.filters.langid: true; set that too, or 0")


# Upper bounds on what a config may ask to allocate. A checkpoint's config is read back through the
# same checks, so a crafted few-KB file cannot make the loader build a model of terabytes. Each bound
# is far above any published MT model (Transformer-big: d_model 1024, d_ff 4096, 16 heads, 6 layers).
LIMITS = {
    "model.encoder_layers": 1024,
    "model.decoder_layers": 1024,
    "model.d_model": 65536,
    "model.heads": 1024,
    "model.head_dim": 65536,
    "model.value_dim": 65536,
    "model.d_ff": 1 << 20,
    "model.max_positions": 1 << 20,
    "tokenizer.vocab_size": 1 << 21,
    "train.max_tokens": 1 << 26,
    "train.update_freq": 1 << 16,
    "decode.beam": 1024,
    "decode.nbest": 1024,
    "decode.batch_tokens": 1 << 26,
    "decode.max_len_b": 1 << 20,
    "decode.max_len_a": 64,
    "data.max_len": 1 << 20,
    "train.valid_beam": 1024,
}
# The memory bound of a model: 2^31 numbers (parameters and buffers) are 8 GiB in float32, what a workstation
# holds with room to decode, and ten times Transformer-big (213M) or the largest MarianMT model (~600M). A config,
# a checkpoint or an imported model above it is refused before anything is allocated.
MAX_PARAMETERS = 1 << 31
# A sinusoid position table computed on load (never stored): 1 GiB is 500k positions at d_model 512,
# far past any sentence
MAX_POSITION_TABLE_BYTES = 1 << 30


def model_elements(m: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """The numbers (parameters and buffers) a model of these sizes holds, counted without building it: the layers,
    the embeddings and the output layer as ``model.share_*`` ties them, and the position table (learned or the
    sinusoids). Within a few hundred of the built model's count (its norms are counted generously)."""
    d = m.d_model
    dk, dv = m.head_dim or d // m.heads, m.value_dim or d // m.heads
    attention = m.heads * (2 * dk + dv) * (d + 1) + m.heads * dv * d + d  # fused q/k/v projection + output projection
    ffn = 2 * d * m.d_ff + m.d_ff + d
    layers = m.encoder_layers * (attention + ffn + 4 * d) + m.decoder_layers * (2 * attention + ffn + 6 * d)
    tgt_embed = 0 if m.share_all_embeddings else tgt_vocab_size * d
    output = (0 if m.share_all_embeddings or m.share_decoder_embeddings else tgt_vocab_size * d) + tgt_vocab_size * (
        m.output_bias + 2 * m.restrict_output
    )
    return layers + src_vocab_size * d + tgt_embed + output + m.max_positions * d + 4 * d


def size_problem(elements: int) -> str | None:
    """Why a model of ``elements`` numbers (parameters and buffers) is refused, or None when it is within
    :data:`MAX_PARAMETERS`; worded to follow the name of what asked for it."""
    if elements <= MAX_PARAMETERS:
        return None
    return (
        f"about {elements:.3g} parameters, above the supported {MAX_PARAMETERS:.3g} "
        f"({elements * 4 / 2**30:.3g} GiB in float32, the bound is {MAX_PARAMETERS * 4 / 2**30:.3g} GiB); "
        "check model.* (layers, d_model, d_ff, heads) and the vocabulary"
    )


def _check_bounds(cfg: Config, fail: Fail) -> None:
    for dotted, limit in LIMITS.items():
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value > limit:
            fail(
                dotted,
                f"{value} is above the supported maximum {limit}; "
                "check the value (a checkpoint with it is damaged or crafted)",
            )
    vocab = cfg.tokenizer.vocab_size  # a checkpoint's loader checks again with its tokenizers' real sizes
    problem = size_problem(model_elements(cfg.model, src_vocab_size=vocab, tgt_vocab_size=vocab))
    if problem:
        fail("model", f"these sizes make {problem}")
