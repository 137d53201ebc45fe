"""Typed configuration: one dataclass per concern, loaded from YAML and validated.

A YAML file has up to five top-level sections, ``data``, ``tokenizer``, ``model``,
``train`` and ``decode``; every field has a default, so a file states only what it
changes. Unknown keys, wrong types and impossible values raise :class:`ConfigError`
with one line that names the file, the key and what to change. Dotted overrides
(``model.encoder_layers=3``) go through the same checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from transformer_mt.errors import TmtError


class ConfigError(TmtError, ValueError):
    """A configuration mistake, worded for the user (one line, names the key and the fix)."""


@dataclass
class DataConfig:
    """Where the parallel corpus lives and how it is filtered."""

    train_src: str = ""  # training source text, one sentence per line
    train_tgt: str = ""  # training target text, line i translates line i of train_src
    valid_src: str = ""  # validation source text (loss, perplexity and BLEU during training)
    valid_tgt: str = ""  # validation target text
    max_len: int = 256  # training pairs with more tokens than this on either side are dropped
    max_len_ratio: float = 3.0  # pairs whose longer side has more than this times the tokens of the shorter are dropped
    min_len_for_ratio: int = 5  # the ratio filter applies only when the longer side has at least this many tokens
    cache_dir: str = ""  # where encoded corpora are cached; empty = <train.out_dir>/cache
    # subword regularisation: training pairs re-segmented by sampling every epoch; 0 = off;
    # unigram: smoothing alpha (0.1-0.5, lower = more varied), bpe: BPE-dropout rate (~0.1)
    subword_alpha: float = 0.0
    subword_nbest: int = -1  # unigram sampling among the n best segmentations; -1 = all of them


@dataclass
class TokenizerConfig:
    """The sentencepiece model(s): reuse existing ones or train them at the start of `tmt train`."""

    model: str = ""  # joint (or source) .model file; empty = train one into <train.out_dir>
    tgt_model: str = ""  # target .model when joint is false; empty = train one
    joint: bool = True  # one vocabulary for both languages (needed for model.share_all_embeddings)
    model_type: str = "unigram"  # sentencepiece algorithm: unigram or bpe
    vocab_size: int = 8000  # pieces per model, special symbols included
    character_coverage: float = 1.0  # share of characters covered; 0.9995 suits large alphabets
    input_sentence_size: int = 2_000_000  # sentences sampled for training the tokenizer (0 = all)


@dataclass
class ModelConfig:
    """Transformer sizes (Table 3 of the paper); the defaults are the base model."""

    encoder_layers: int = 6  # N for the encoder
    decoder_layers: int = 6  # N for the decoder
    d_model: int = 512  # width of embeddings and every residual stream
    heads: int = 8  # h, attention heads per layer
    head_dim: int = 0  # d_k, query/key size per head; 0 = d_model / heads (Table 3 row B changes it)
    value_dim: int = 0  # d_v, value size per head; 0 = d_model / heads
    d_ff: int = 2048  # inner size of the position-wise feed-forward network
    dropout: float = 0.1  # P_drop on sublayer outputs and on embeddings + positions
    attention_dropout: float = 0.0  # dropout on attention weights (0 in the paper)
    activation_dropout: float = 0.0  # dropout after the FFN activation (0 in the paper)
    activation: str = "relu"  # FFN activation: relu or gelu
    norm: str = "post"  # post = LayerNorm(x + sublayer(x)) (paper); pre = x + sublayer(LayerNorm(x));
    # scale = pre placement with ScaleNorm g * x / ||x|| and FixNorm embeddings (Nguyen & Salazar 2019)
    positions: str = "sinusoidal"  # sinusoidal (paper) or learned (Table 3 row E)
    max_positions: int = 1024  # longest sequence the model accepts (size of the learned table)
    share_all_embeddings: bool = True  # one matrix for source, target and output (needs a joint vocabulary)
    share_decoder_embeddings: bool = True  # tie target embedding and output projection
    restrict_output: bool = False  # output layer over the pieces seen on the training target side only (faster with a joint vocabulary)


@dataclass
class TrainConfig:
    """The optimisation loop, its schedule, checkpoints and stopping rules."""

    out_dir: str = "runs/default"  # checkpoints, logs, metrics and the resolved config go here
    seed: int = 1  # seeds parameters, dropout and batch order
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    dtype: str = "float32"  # float32, bfloat16 (autocast, CPU or CUDA), float16 (autocast + loss scaling, CUDA) or auto (per machine: runtime.auto_dtype)
    max_tokens: int = 4096  # token budget per batch (the larger of source and target tokens, padding included)
    update_freq: int = 1  # batches whose gradients are accumulated into one update
    label_smoothing: float = 0.1  # eps_ls of section 5.4
    optimizer_betas: tuple[float, float] = (0.9, 0.98)  # Adam beta1, beta2 (section 5.3)
    optimizer_eps: float = 1e-9  # Adam epsilon (section 5.3)
    weight_decay: float = 0.0  # decoupled weight decay (AdamW); 0 = plain Adam as in the paper
    # noam: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) * lr_scale; inverse_sqrt: peaks at lr;
    # linear: peaks at lr, decays to 0 at max_updates; wsd: warm-up, stable at lr, then a linear cool-down to 0 over
    # the last `cooldown` fraction of the budget (of max_time when it is set, so a timed run ends cool on any machine)
    lr_schedule: str = "noam"
    lr: float = 5e-4  # peak learning rate of the inverse_sqrt schedule
    lr_scale: float = 1.0  # multiplier of the paper's noam formula
    warmup_updates: int = 4000  # warmup_steps of section 5.3
    cooldown: float = 0.2  # wsd: fraction of the budget (max_time if set, else max_updates) spent cooling down
    ema_decay: float = 0.0  # exponential moving average of the weights (e.g. 0.999), used for validation and decoding; 0 = off
    clip_norm: float = 0.0  # clip the gradient norm to this; 0 = no clipping
    max_updates: int = 0  # stop after this many updates; 0 = no limit
    max_epochs: int = 0  # stop after this many epochs; 0 = no limit
    max_time: float = 0.0  # stop after this many minutes of training; 0 = no limit
    validate_every: int = 1000  # updates between validations (and checkpoint saves)
    save_every: int = 0  # updates between numbered checkpoints kept on disk (validated or not); 0 = at every validation
    keep_last: int = 5  # numbered checkpoints kept (the newest ones); 0 = keep all
    keep_every: int = 0  # also keep, past keep_last, every numbered checkpoint whose update is a multiple of this (for `tmt average --every`); 0 = none
    best_metric: str = "bleu"  # bleu (higher is better) or loss (lower is better) picks checkpoint_best.pt
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    valid_bleu_sentences: int = 0  # sentences of the validation set decoded for BLEU; 0 = all, -1 = skip BLEU
    valid_beam: int = 1  # beam size for validation BLEU (1 = greedy, fastest); lenpen from decode.lenpen
    log_every: int = 100  # updates between lines of the log and metrics file
    tensorboard: bool = False  # also write the metrics.jsonl scalars as TensorBoard events in <out_dir>/tensorboard (pip install -e ".[tensorboard]")
    peak_tflops: float = 0.0  # the device's matmul peak, for the MFU of the end-of-training cost report; 0 = measure once, cached in ~/.cache/tmt/peak.json

    @property
    def numbered_spacing(self) -> int:
        """Updates between numbered checkpoints: save_every, else validate_every (one at every validation)."""
        return self.save_every or self.validate_every

    def writes_numbered(self, update: int, *, validating: bool) -> bool:
        """Whether `update` writes checkpoint_<update>.pt: at multiples of save_every, or at every validation
        (the final one too, whatever its update) when save_every is 0."""
        return update % self.save_every == 0 if self.save_every else validating


@dataclass
class DecodeConfig:
    """Search settings used by `tmt translate`, `tmt evaluate` and validation BLEU."""

    beam: int = 4  # beam size (section 6.1); 1 = greedy
    lenpen: float = 0.6  # alpha of the GNMT length penalty ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50  # (paper: input length + 50)
    batch_tokens: int = 4096  # source tokens per decoding batch
    nbest: int = 1  # hypotheses printed per input


@dataclass
class Config:
    """A whole experiment."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


_SECTION_TYPES = get_type_hints(Config)
CHOICES = {
    "tokenizer.model_type": ("unigram", "bpe"),
    "model.activation": ("relu", "gelu"),
    "model.norm": ("post", "pre", "scale"),
    "model.positions": ("sinusoidal", "learned"),
    "train.dtype": ("float32", "bfloat16", "float16", "auto"),
    "train.lr_schedule": ("noam", "inverse_sqrt", "linear", "wsd"),
    "train.best_metric": ("bleu", "loss"),
}
PATH_KEYS = ("data.train_src", "data.train_tgt", "data.valid_src", "data.valid_tgt", "tokenizer.model", "tokenizer.tgt_model")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201 - PyYAML's signature
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key '{key}' appears twice in one section; keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> Any:
    """Parse a YAML config file strictly: syntax errors and duplicate keys name the file and the line."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {exc.start}); save the config as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{line} is not valid YAML ({getattr(exc, 'problem', exc)}); fix the syntax") from None


def _override_value(dotted: str, text: str) -> Any:
    """The YAML value of one ``--set section.key=value``; a syntax error names the override."""
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"--set {dotted}={text}: the value is not valid YAML ({problem}); quote strings, e.g. --set '{dotted}=\"...\"', and close lists, e.g. [0.9, 0.98]"
        ) from None


def _suggest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{close[0]}'?"
    return "valid keys: " + ", ".join(valid)


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Convert a YAML (or override) value to the field's type or raise ConfigError."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            as_float = float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if not math.isfinite(as_float) or not as_float.is_integer():
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(as_float)
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # NaN passes every `<` check, and a NaN learning rate trains nothing
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if typ is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return "" if value is None else str(value)
    if getattr(typ, "__origin__", None) is tuple:
        if isinstance(value, str):
            value = yaml.safe_load(value if value.startswith("[") else f"[{value}]")
        args = typ.__args__
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(v, t, where) for v, t in zip(value, args))
    raise ConfigError(f"{where}: unsupported type {typ}")  # pragma: no cover - a programming error


def _apply(cfg: Config, section: str, key: str, value: Any, source: str) -> None:
    if section not in _SECTION_TYPES:
        raise ConfigError(f"{source}: unknown section '{section}'; {_suggest(section, list(_SECTION_TYPES))}")
    sub = getattr(cfg, section)
    hints = get_type_hints(type(sub))
    if key not in hints:
        raise ConfigError(f"{source}: unknown key '{section}.{key}'; {_suggest(key, list(hints))}")
    setattr(sub, key, _coerce(value, hints[key], f"{source}: {section}.{key}"))


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None, *, check_files: bool = True) -> Config:
    """Read a YAML config (or start from the defaults), apply ``section.key=value`` overrides, validate.

    Relative data and tokenizer paths are resolved against the current directory, as users type them.
    """
    cfg = Config()
    if path is not None:
        if not str(path).strip():
            raise ConfigError("--config: the path is empty; give a YAML file, e.g. --config configs/multi30k_small.yaml")
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{path}: is a directory, not a config file; give a YAML file (to continue a run directory use --resume {path})")
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found; check the path given to --config")
        raw = _read_yaml(path) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (data, tokenizer, model, train, decode) at the top")
        for section, values in raw.items():
            if section not in _SECTION_TYPES:
                raise ConfigError(f"{path}: unknown section '{section}'; {_suggest(str(section), list(_SECTION_TYPES))}")
            if values is None:
                continue
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: section '{section}' must be a mapping of key: value")
            for key, value in values.items():
                _apply(cfg, section, str(key), value, str(path))
    for item in overrides or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. model.encoder_layers=3")
        dotted, value = item.split("=", 1)
        section, key = dotted.strip().split(".", 1)
        _apply(cfg, section, key, _override_value(dotted.strip(), value), f"--set {dotted.strip()}")
    validate(cfg, source=str(path) if path is not None else "config", check_files=check_files)
    return cfg


def validate(cfg: Config, *, source: str = "config", check_files: bool = True) -> None:
    """Raise ConfigError on the first impossible value."""

    def fail(key: str, msg: str) -> None:
        raise ConfigError(f"{source}: {key}: {msg}")

    for dotted, allowed in CHOICES.items():
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value not in allowed:
            fail(dotted, f"{value!r} is not one of {', '.join(allowed)}")
    m, t, d, tok = cfg.model, cfg.train, cfg.decode, cfg.tokenizer
    for key in ("encoder_layers", "decoder_layers", "d_model", "heads", "d_ff", "max_positions"):
        if getattr(m, key) < 1:
            fail(f"model.{key}", f"must be at least 1, got {getattr(m, key)}")
    if m.head_dim < 0 or m.value_dim < 0:
        fail("model.head_dim", "must be 0 (= d_model / heads) or positive")
    if (m.head_dim == 0 or m.value_dim == 0) and m.d_model % m.heads:
        fail(
            "model.d_model",
            f"{m.d_model} is not divisible by model.heads={m.heads}; choose d_model as a multiple of heads (or set model.head_dim and model.value_dim)",
        )
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        if not 0.0 <= getattr(m, key) < 1.0:
            fail(f"model.{key}", f"{getattr(m, key)} is outside [0, 1); use e.g. 0.1")
    if not 0.0 <= t.label_smoothing < 1.0:
        fail("train.label_smoothing", f"{t.label_smoothing} is outside [0, 1); the paper uses 0.1")
    if m.share_all_embeddings and not tok.joint:
        fail("model.share_all_embeddings", "needs a joint vocabulary; set tokenizer.joint: true or model.share_all_embeddings: false")
    if tok.vocab_size < 8:
        fail("tokenizer.vocab_size", f"{tok.vocab_size} is too small; use at least a few thousand for real data")
    if not 0.0 < tok.character_coverage <= 1.0:
        fail("tokenizer.character_coverage", f"{tok.character_coverage} must be in (0, 1]; use 1.0 or 0.9995")
    for key in ("max_tokens", "update_freq", "validate_every", "log_every"):
        if getattr(t, key) < 1:
            fail(f"train.{key}", f"must be at least 1, got {getattr(t, key)}")
    for key in (
        "max_updates",
        "max_epochs",
        "max_time",
        "save_every",
        "keep_last",
        "keep_every",
        "patience",
        "warmup_updates",
        "weight_decay",
        "clip_norm",
        "threads",
    ):
        if getattr(t, key) < 0:
            fail(f"train.{key}", f"must be 0 or positive, got {getattr(t, key)}")
    spacing = t.numbered_spacing
    if t.keep_every and t.keep_every % spacing:
        nearest = spacing * max(1, round(t.keep_every / spacing))
        fail(
            "train.keep_every",
            f"{t.keep_every} is not a multiple of train.{'save_every' if t.save_every else 'validate_every'} ({spacing}), "
            f"so only the updates that are multiples of both would be kept; use a multiple of {spacing}, e.g. {nearest}",
        )
    if t.lr <= 0 or t.lr_scale <= 0:
        fail("train.lr", "learning rate and lr_scale must be positive")
    if t.lr_schedule == "inverse_sqrt" and t.warmup_updates < 1:
        fail("train.warmup_updates", "inverse_sqrt needs warmup_updates >= 1")
    if t.lr_schedule == "linear" and t.max_updates <= t.warmup_updates:
        fail(
            "train.max_updates",
            f"lr_schedule linear decays to 0 at max_updates, which must be above warmup_updates "
            f"(got max_updates={t.max_updates}, warmup_updates={t.warmup_updates}); set train.max_updates",
        )
    if t.lr_schedule == "wsd" and not (t.max_time or t.max_updates):
        fail("train.lr_schedule", "wsd cools down over the end of the budget; set train.max_time (minutes) or train.max_updates")
    if not 0.0 < t.cooldown <= 1.0:
        fail("train.cooldown", f"{t.cooldown} is outside (0, 1]; use e.g. 0.2 (the last fifth of the budget)")
    if not 0.0 <= t.ema_decay < 1.0:
        fail("train.ema_decay", f"{t.ema_decay} is outside [0, 1); use 0 (off) or e.g. 0.999")
    if not all(0.0 <= b < 1.0 for b in t.optimizer_betas):
        fail("train.optimizer_betas", f"{t.optimizer_betas} must both be in [0, 1); the paper uses [0.9, 0.98]")
    if d.beam < 1 or d.nbest < 1 or d.nbest > d.beam:
        fail("decode.nbest", f"need 1 <= nbest <= beam, got beam={d.beam} nbest={d.nbest}")
    if t.valid_beam < 1:
        fail("train.valid_beam", f"must be at least 1, got {t.valid_beam}")
    if d.batch_tokens < 1:
        fail("decode.batch_tokens", "must be at least 1")
    if not 0.0 <= cfg.data.subword_alpha <= 1.0:
        fail("data.subword_alpha", f"{cfg.data.subword_alpha} is outside [0, 1]; use 0 (off), 0.1-0.5 for unigram or about 0.1 for bpe")
    if cfg.data.subword_nbest != -1 and cfg.data.subword_nbest < 2:
        fail("data.subword_nbest", f"{cfg.data.subword_nbest} samples nothing; use -1 (all segmentations) or at least 2")
    if cfg.data.max_len < 1 or cfg.data.max_len_ratio < 1.0:
        fail("data.max_len", "max_len must be >= 1 and max_len_ratio >= 1")
    if cfg.data.max_len + 1 > m.max_positions:  # + EOS on the source, + BOS on the decoder input
        fail(
            "data.max_len",
            f"{cfg.data.max_len} + 1 (EOS or BOS) exceeds model.max_positions={m.max_positions}; lower data.max_len or raise model.max_positions",
        )
    if bool(cfg.data.valid_src) != bool(cfg.data.valid_tgt):
        given, missing = ("valid_src", "valid_tgt") if cfg.data.valid_src else ("valid_tgt", "valid_src")
        fail(f"data.{missing}", f"is empty while data.{given} is set; give both validation files, or neither to train without validation")
    _check_bounds(cfg, fail)
    if check_files:
        for dotted in PATH_KEYS:
            section, key = dotted.split(".")
            value = getattr(getattr(cfg, section), key)
            if value and not Path(value).is_file():
                fail(dotted, f"file '{value}' not found; check the path (relative paths start from the current directory)")


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
MAX_PARAMETERS = 100_000_000_000  # 100B: a rough count (below) above this is refused before any allocation


def _check_bounds(cfg: Config, fail) -> None:  # noqa: ANN001 - validate()'s local fail()
    for dotted, limit in LIMITS.items():
        section, key = dotted.split(".")
        value = getattr(getattr(cfg, section), key)
        if value > limit:
            fail(dotted, f"{value} is above the supported maximum {limit}; check the value (a checkpoint with it is damaged or crafted)")
    if cfg.decode.max_len_a < 0 or cfg.decode.max_len_b < 0:
        fail("decode.max_len_a", f"max_len_a={cfg.decode.max_len_a} and max_len_b={cfg.decode.max_len_b} must be 0 or positive")
    m = cfg.model
    dk, dv = m.head_dim or m.d_model // m.heads, m.value_dim or m.d_model // m.heads
    attn = m.heads * (2 * dk + dv) * m.d_model + m.heads * dv * m.d_model
    per_layer = 2 * attn + 2 * m.d_model * m.d_ff  # decoder layer (self + cross); an encoder layer is smaller
    rough = (m.encoder_layers + m.decoder_layers) * per_layer + 3 * cfg.tokenizer.vocab_size * m.d_model + m.max_positions * m.d_model
    if rough > MAX_PARAMETERS:
        fail("model", f"these sizes make about {rough:.3g} parameters, above the supported {MAX_PARAMETERS:.0e}; check model.* (layers, d_model, d_ff, heads)")


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """Plain nested dict (tuples as lists) for YAML files and checkpoints."""
    out = dataclasses.asdict(cfg)
    for section in out.values():
        for key, value in section.items():
            if isinstance(value, tuple):
                section[key] = list(value)
    return out


def from_dict(raw: dict[str, dict[str, Any]], *, source: str = "checkpoint") -> Config:
    """Inverse of :func:`to_dict`; checks types and values but not that files still exist."""
    cfg = Config()
    for section, values in raw.items():
        for key, value in values.items():
            _apply(cfg, section, key, value, source)
    validate(cfg, source=source, check_files=False)
    return cfg


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config, so a run can be reproduced with `tmt train --config`."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
