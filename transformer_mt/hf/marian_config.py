"""MarianMT's ``config.json`` and tmt's ``model`` section, both ways.

What maps (``transformers.MarianConfig`` field -> ``model.*`` key):

- ``d_model``, ``encoder_layers``, ``decoder_layers``, ``dropout``, ``attention_dropout``,
  ``activation_dropout``: the keys of the same meaning; ``encoder_attention_heads`` = ``decoder_attention_heads``
  -> ``heads``; ``encoder_ffn_dim`` = ``decoder_ffn_dim`` -> ``d_ff`` (tmt has one size for both stacks);
- ``activation_function`` relu, gelu (torch's exact erf GELU in both), swish or silu (one function) -> ``activation``;
- ``max_position_embeddings`` -> ``max_positions`` (MarianMT's sinusoid table; tmt's grows past it when decoding);
- ``share_encoder_decoder_embeddings`` -> ``share_all_embeddings``; ``tie_word_embeddings`` ->
  ``share_decoder_embeddings``;
- ``vocab_size`` / ``decoder_vocab_size``: the source / target vocabulary sizes;
- ``pad_token_id``, ``eos_token_id``, ``decoder_start_token_id``, ``bos_token_id`` -> ``pad_id``, ``eos_id``,
  ``decoder_start_id``, ``bos_id`` (``unk_id`` is the vocabulary's ``<unk>``, MarianTokenizer's rule);
- always: post-norm LayerNorm (eps 1e-5, torch's default in both), sinusoids in the ``halves`` layout from
  position 0, embeddings scaled by sqrt(d_model), ``final_logits_bias`` as ``output_bias``.

What does not map is refused in one line naming the field (:class:`~transformer_mt.hf.HfError`).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, NoReturn

from transformer_mt.config import LIMITS, ModelConfig, quote, specials_problem
from transformer_mt.hf.errors import HfError
from transformer_mt.text import NO_ID

ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "swish": "swish",
    "silu": "swish",
}  # MarianConfig name -> model.activation
# Fields of older MarianMT / BART-family configs that must hold the value MarianMT's code assumes, and why tmt
# cannot follow another value (transformers removed most of them: their value is now fixed in the code).
FIXED_FIELDS: dict[str, tuple[object, str]] = {
    "scale_embedding": (True, "tmt always multiplies embeddings by sqrt(d_model)"),
    "static_position_embeddings": (True, "tmt's positions here are the fixed sinusoids"),
    "normalize_before": (False, "pre-norm layers are not MarianMT's; tmt imports post-norm ones"),
    "add_final_layer_norm": (False, "a final LayerNorm per stack belongs to pre-norm models"),
    "normalize_embedding": (False, "tmt has no LayerNorm on the embeddings"),
    "layernorm_embedding": (False, "tmt has no LayerNorm on the embeddings"),
    "add_bias_logits": (False, "the output bias is final_logits_bias, not a second one"),
    "encoder_layerdrop": (0.0, "tmt has no LayerDrop"),
    "decoder_layerdrop": (0.0, "tmt has no LayerDrop"),
    "is_encoder_decoder": (True, "tmt imports encoder-decoder models"),
}
MAX_POSITIONS = 1024  # MarianConfig's default max_position_embeddings
# MarianConfig's defaults for the fields a config.json may leave out (transformers fills them the same way).
DEFAULTS: dict[str, object] = {
    "scale_embedding": False,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "activation_function": "gelu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "eos_token_id": 0,
    "bos_token_id": None,
}
# MarianMT's names of tmt's special ids (unk_id is vocab.json's <unk>)
SPECIAL_FIELDS = {
    "pad_token_id": "pad_id",
    "eos_token_id": "eos_id",
    "bos_token_id": "bos_id",
    "decoder_start_token_id": "decoder_start_id",
    "vocab.json's <unk>": "unk_id",
}
# The key of tmt's config each size maps to: its limit (config.LIMITS) is the import's.
LIMIT_KEYS = {
    "encoder_layers": "model.encoder_layers",
    "decoder_layers": "model.decoder_layers",
    "d_model": "model.d_model",
    "encoder_attention_heads": "model.heads",
    "decoder_attention_heads": "model.heads",
    "encoder_ffn_dim": "model.d_ff",
    "decoder_ffn_dim": "model.d_ff",
    "max_position_embeddings": "model.max_positions",
    "vocab_size": "tokenizer.vocab_size",
    "decoder_vocab_size": "tokenizer.vocab_size",
}


class MarianShape(NamedTuple):
    """A MarianMT model as tmt builds it: the ``model`` section and the two vocabulary sizes."""

    model: ModelConfig
    src_vocab_size: int
    tgt_vocab_size: int


def model_config_from_marian(config: dict[str, Any], *, unk_id: int, source: str = "config.json") -> MarianShape:
    """The ``model`` section and vocabulary sizes of a MarianMT ``config.json`` (a parsed dict); ``unk_id`` is the
    vocabulary's ``<unk>``. Raises HfError naming ``source`` and the field for what tmt cannot represent, and for a
    value of the wrong type or beyond the limits of :data:`~transformer_mt.config.LIMITS` (before anything is
    allocated; the whole config then passes :func:`~transformer_mt.config.validate` in the importer)."""
    field = _Fields(config, source)
    model_type = field.get("model_type", "marian")
    if model_type != "marian":
        raise HfError(
            f"{source}: model_type {quote(model_type)} is not marian; tmt imports MarianMT (OPUS-MT) models only"
        )
    for name, (want, why) in FIXED_FIELDS.items():
        value = field.get(name, DEFAULTS.get(name, want))
        if value != want or isinstance(value, bool) != isinstance(want, bool):  # 1 is not true, false is not 0.0
            raise HfError(
                f"{source}: {name}={_json(value)} cannot be imported ({why}); only {name}={_json(want)} maps to tmt"
            )
    activation = field.get("activation_function", DEFAULTS["activation_function"])
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise HfError(
            f"{source}: activation_function={_json(activation)} has no tmt equivalent; tmt has {', '.join(ACTIVATIONS)}"
        )
    heads, d_ff = (
        field.same("encoder_attention_heads", "decoder_attention_heads"),
        field.same("encoder_ffn_dim", "decoder_ffn_dim"),
    )
    shared = field.flag("share_encoder_decoder_embeddings")
    tied = field.flag("tie_word_embeddings")
    if shared and not tied:
        raise HfError(
            f"{source}: tie_word_embeddings=false with share_encoder_decoder_embeddings=true cannot be imported "
            "(tmt ties the output layer to a shared embedding matrix)"
        )
    src_vocab = field.size("vocab_size")
    tgt_vocab = src_vocab if shared else field.size("decoder_vocab_size", default=src_vocab)
    d_model = field.size("d_model")
    if d_model % heads:
        raise HfError(f"{source}: d_model={d_model} is not divisible by encoder_attention_heads={heads}")
    pad, eos = field.token_id("pad_token_id", tgt_vocab), field.token_id("eos_token_id", tgt_vocab)
    start = field.token_id("decoder_start_token_id", tgt_vocab, default=pad)
    bos = NO_ID if field.get("bos_token_id") is None else field.token_id("bos_token_id", tgt_vocab)
    # MarianMT has no BOS: OPUS-MT configs repeat the EOS id there, which tmt must not mask as a second special id.
    bos = bos if bos not in (eos, pad) else NO_ID
    model = ModelConfig(
        encoder_layers=field.size("encoder_layers"),
        decoder_layers=field.size("decoder_layers"),
        d_model=d_model,
        heads=heads,
        d_ff=d_ff,
        dropout=field.fraction("dropout"),
        attention_dropout=field.fraction("attention_dropout"),
        activation_dropout=field.fraction("activation_dropout"),
        activation=ACTIVATIONS[activation],
        norm="post",
        positions="sinusoidal",
        position_layout="halves",
        max_positions=field.size("max_position_embeddings", default=MAX_POSITIONS, low=2),  # a piece and EOS
        share_all_embeddings=shared,
        share_decoder_embeddings=tied,
        output_bias=True,
        pad_id=pad,
        unk_id=unk_id,
        bos_id=bos,
        eos_id=eos,
        decoder_start_id=NO_ID if start == bos else start,
    )
    problem = specials_problem(model, vocab_size=tgt_vocab)
    if problem:  # worded with MarianMT's names: the tmt key a special id maps to is not in config.json
        names = {f"model.{ours}": theirs for theirs, ours in SPECIAL_FIELDS.items()}
        reason = problem.reason
        for ours, theirs in names.items():
            reason = reason.replace(ours, theirs)
        raise HfError(f"{source}: {names[problem.key]}={quote(problem.value)} {reason}")
    return MarianShape(model, src_vocab, tgt_vocab)


def shape_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` fields MarianMT and M2M100 (both of BART's family) write alike: the sizes, the activation,
    the dropouts, and no LayerDrop (tmt trains without it)."""
    return {
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads,
        "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "activation_function": cfg.activation,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
    }


def marian_config(cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, Any]:
    """The ``config.json`` of a MarianMT model equal to ``cfg`` (:func:`marian_refusal` must have passed)."""
    shared = cfg.share_all_embeddings
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        **shape_fields(cfg),
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "vocab_size": src_vocab_size,
        "decoder_vocab_size": tgt_vocab_size,
        "share_encoder_decoder_embeddings": shared,
        "tie_word_embeddings": shared or cfg.share_decoder_embeddings,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "bos_token_id": None if cfg.bos_id == NO_ID else cfg.bos_id,
        "decoder_start_token_id": cfg.start_id,
        # tmt's search finishes a hypothesis at the length limit as it is, without forcing EOS
        "forced_eos_token_id": None,
        "is_encoder_decoder": True,
        "init_std": 0.02,
        "use_cache": True,
        "dtype": "float32",
    }


def marian_refusal(cfg: ModelConfig) -> str | None:
    """Why ``cfg`` cannot be written as a MarianMT model (one clause naming the key and the fix), or None."""
    if cfg.position_layout == "fairseq" or cfg.position_offset or cfg.decoder_languages:
        return (
            f"model.position_layout={cfg.position_layout}, model.position_offset={cfg.position_offset}: an M2M100 / "
            "NLLB model (fairseq's sinusoids, the target language on the decoder); export it with --format m2m100-hf"
        )
    if cfg.norm != "post":
        return (
            f"model.norm={cfg.norm}: MarianMT's layers are post-norm (LayerNorm after each residual add, no final norm "
            "per stack) "
            "and ScaleNorm / pre-norm have no MarianMT equivalent; only model.norm: post models export to marian-hf"
        )
    if cfg.positions != "sinusoidal":
        return (
            f"model.positions={cfg.positions}: MarianMT has fixed sinusoidal positions only; export a model trained "
            "with model.positions: sinusoidal"
        )
    size = cfg.d_model // cfg.heads
    if cfg.d_model % cfg.heads or (cfg.head_dim or size) != size or (cfg.value_dim or size) != size:
        return (
            f"model.head_dim={cfg.head_dim} / model.value_dim={cfg.value_dim} with d_model={cfg.d_model} and "
            f"heads={cfg.heads}: MarianMT's heads are d_model / heads wide for queries, keys and values"
        )
    return None


class _Fields:
    """Typed reads of a config.json dict, each mistake one line naming the file and the field (its value quoted,
    at most a few dozen characters of it)."""

    def __init__(self, config: dict[str, Any], source: str):
        self.config, self.source = config, source

    def get(self, name: str, default: object = None) -> Any:
        return self.config.get(name, default)

    def _fail(self, name: str, value: object, what: str) -> NoReturn:
        raise HfError(f"{self.source}: {name}={_json(value)} {what}; fix config.json")

    def integer(self, name: str, *, default: int | None = None, low: int = 0, high: int | None = None) -> int:
        """An integer from ``low`` to ``high``; missing or null: ``default`` (None: required)."""
        value = self.config.get(name)
        if value is None:
            value = default
        if value is None:
            raise HfError(f"{self.source}: {name} is missing; MarianMT's config.json states it as an integer")
        if not isinstance(value, int) or isinstance(value, bool):
            self._fail(name, value, "must be an integer")
        if value < low or (high is not None and value > high):
            self._fail(
                name,
                value,
                f"is out of range; tmt imports {low} to {high}" if high is not None else f"must be at least {low}",
            )
        return value

    def size(self, name: str, *, default: int | None = None, low: int = 1) -> int:
        """A size: at least ``low``, at most the limit tmt's config sets on the key it maps to (:data:`LIMIT_KEYS`)."""
        return self.integer(name, default=default, low=low, high=LIMITS[LIMIT_KEYS[name]])

    def token_id(self, name: str, vocab_size: int, *, default: int | None = None) -> int:
        """An id of the target vocabulary; transformers also accepts a list of ids there, and tmt one of them."""
        value = self.config.get(name, DEFAULTS.get(name))
        if isinstance(value, list):
            if len(value) != 1:
                self._fail(name, value, "lists several ids; tmt ends a sequence with one id")
            value = value[0]
        self.config = {**self.config, name: value}
        index = self.integer(name, default=default)
        if index >= vocab_size:
            raise HfError(
                f"{self.source}: {name}={index} is outside the target vocabulary of {vocab_size} (decoder_vocab_size)"
            )
        return index

    def fraction(self, name: str) -> float:
        """A dropout rate: a number in [0, 1)."""
        value = self.config.get(name, DEFAULTS[name])
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            self._fail(name, value, "must be a number in [0, 1), e.g. 0.1")
        return float(value)

    def flag(self, name: str) -> bool:
        """true or false; missing: MarianConfig's default."""
        value = self.config.get(name, DEFAULTS[name])
        if not isinstance(value, bool):
            self._fail(name, value, "must be true or false")
        return value

    def same(self, encoder: str, decoder: str) -> int:
        enc, dec = self.size(encoder), self.size(decoder)
        if enc != dec:
            raise HfError(
                f"{self.source}: {encoder}={enc} differs from {decoder}={dec}; tmt uses one size for both stacks"
            )
        return enc


def _json(value: object) -> str:
    """A value as config.json spells it (true, false, null), others quoted at most a few dozen characters long."""
    return json.dumps(value) if isinstance(value, (bool, type(None))) else quote(value)
