"""MarianMT's ``config.json`` and tmt's ``model`` section, both ways.

What maps (``transformers.MarianConfig`` field -> ``model.*`` key):

- ``d_model``, ``encoder_layers``, ``decoder_layers``, ``dropout``, ``attention_dropout``,
  ``activation_dropout``: the keys of the same meaning; ``encoder_attention_heads`` = ``decoder_attention_heads``
  -> ``heads``; ``encoder_ffn_dim`` = ``decoder_ffn_dim`` -> ``d_ff`` (tmt has one size for both stacks);
- ``activation_function`` relu, gelu (torch's exact erf GELU in both), swish or silu (one function) -> ``activation``;
- ``max_position_embeddings`` -> ``max_positions`` (MarianMT's sinusoid table; tmt's grows past it when decoding);
- ``share_encoder_decoder_embeddings`` -> ``share_all_embeddings``; ``tie_word_embeddings`` -> ``share_decoder_embeddings``;
- ``vocab_size`` / ``decoder_vocab_size``: the source / target vocabulary sizes;
- ``pad_token_id``, ``eos_token_id``, ``decoder_start_token_id``, ``bos_token_id`` -> ``pad_id``, ``eos_id``,
  ``decoder_start_id``, ``bos_id`` (``unk_id`` is the vocabulary's ``<unk>``, MarianTokenizer's rule);
- always: post-norm LayerNorm (eps 1e-5, torch's default in both), sinusoids in the ``halves`` layout from
  position 0, embeddings scaled by sqrt(d_model), ``final_logits_bias`` as ``output_bias``.

What does not map is refused in one line naming the field (:class:`~transformer_mt.hf.HfError`).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from transformer_mt.config import ModelConfig
from transformer_mt.hf import HfError
from transformer_mt.text import NO_ID

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # MarianConfig name -> model.activation
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


class MarianShape(NamedTuple):
    """A MarianMT model as tmt builds it: the ``model`` section and the two vocabulary sizes."""

    model: ModelConfig
    src_vocab_size: int
    tgt_vocab_size: int


def model_config_from_marian(config: dict[str, Any], *, unk_id: int, source: str = "config.json") -> MarianShape:
    """The ``model`` section and vocabulary sizes of a MarianMT ``config.json`` (a parsed dict); ``unk_id`` is the
    vocabulary's ``<unk>``. Raises HfError naming ``source`` and the field for what tmt cannot represent."""
    field = _Fields(config, source)
    if field.get("model_type", "marian") != "marian":
        raise HfError(f"{source}: model_type {field.get('model_type')!r} is not marian; tmt imports MarianMT (OPUS-MT) models only")
    for name, (want, why) in FIXED_FIELDS.items():
        value = field.get(name, DEFAULTS.get(name, want))
        if value != want:
            raise HfError(f"{source}: {name}={_json(value)} cannot be imported ({why}); only {name}={_json(want)} maps to tmt")
    activation = field.get("activation_function", DEFAULTS["activation_function"])
    if activation not in ACTIVATIONS:
        raise HfError(f"{source}: activation_function={activation!r} has no tmt equivalent; tmt has {', '.join(ACTIVATIONS)}")
    heads, d_ff = field.same("encoder_attention_heads", "decoder_attention_heads"), field.same("encoder_ffn_dim", "decoder_ffn_dim")
    shared, tied = field.get("share_encoder_decoder_embeddings", True), field.get("tie_word_embeddings", True)
    if shared and not tied:
        raise HfError(
            f"{source}: tie_word_embeddings=false with share_encoder_decoder_embeddings=true cannot be imported "
            "(tmt ties the output layer to a shared embedding matrix)"
        )
    src_vocab = field.integer("vocab_size")
    tgt_vocab = src_vocab if shared else field.integer("decoder_vocab_size", default=src_vocab)
    d_model = field.integer("d_model")
    if d_model % heads:
        raise HfError(f"{source}: d_model={d_model} is not divisible by encoder_attention_heads={heads}")
    pad, eos = field.integer("pad_token_id"), field.token_id("eos_token_id")
    start = field.integer("decoder_start_token_id", default=pad)
    bos = field.get("bos_token_id", None)
    # MarianMT has no BOS: OPUS-MT configs repeat the EOS id there, which tmt must not mask as a second special id.
    bos = bos if isinstance(bos, int) and bos not in (eos, pad) else NO_ID
    model = ModelConfig(
        encoder_layers=field.integer("encoder_layers"),
        decoder_layers=field.integer("decoder_layers"),
        d_model=d_model,
        heads=heads,
        d_ff=d_ff,
        dropout=float(field.get("dropout", DEFAULTS["dropout"])),
        attention_dropout=float(field.get("attention_dropout", DEFAULTS["attention_dropout"])),
        activation_dropout=float(field.get("activation_dropout", DEFAULTS["activation_dropout"])),
        activation=ACTIVATIONS[activation],
        norm="post",
        positions="sinusoidal",
        position_layout="halves",
        max_positions=field.integer("max_position_embeddings", default=MAX_POSITIONS),
        share_all_embeddings=bool(shared),
        share_decoder_embeddings=bool(tied),
        output_bias=True,
        pad_id=pad,
        unk_id=unk_id,
        bos_id=bos,
        eos_id=eos,
        decoder_start_id=NO_ID if start == bos else start,
    )
    for name, value in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if not 0 <= value < tgt_vocab:
            raise HfError(f"{source}: {name}={value} is outside the target vocabulary of {tgt_vocab} (decoder_vocab_size)")
    return MarianShape(model, src_vocab, tgt_vocab)


def marian_config(cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, Any]:
    """The ``config.json`` of a MarianMT model equal to ``cfg`` (:func:`marian_refusal` must have passed)."""
    shared = cfg.share_all_embeddings
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
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
    if cfg.norm != "post":
        return (
            f"model.norm={cfg.norm}: MarianMT's layers are post-norm (LayerNorm after each residual add, no final norm per stack) "
            "and ScaleNorm / pre-norm have no MarianMT equivalent; only model.norm: post models export to marian-hf"
        )
    if cfg.positions != "sinusoidal":
        return f"model.positions={cfg.positions}: MarianMT has fixed sinusoidal positions only; export a model trained with model.positions: sinusoidal"
    size = cfg.d_model // cfg.heads
    if cfg.d_model % cfg.heads or (cfg.head_dim or size) != size or (cfg.value_dim or size) != size:
        return (
            f"model.head_dim={cfg.head_dim} / model.value_dim={cfg.value_dim} with d_model={cfg.d_model} and heads={cfg.heads}: "
            "MarianMT's heads are d_model / heads wide for queries, keys and values"
        )
    return None


class _Fields:
    """Typed reads of a config.json dict, each mistake one line naming the file and the field."""

    def __init__(self, config: dict[str, Any], source: str):
        self.config, self.source = config, source

    def get(self, name: str, default: object = None) -> Any:
        return self.config.get(name, default)

    def integer(self, name: str, *, default: int | None = None) -> int:
        value = self.config.get(name, default)
        if value is None and default is not None:
            value = default
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise HfError(f"{self.source}: {name}={_json(value)} must be a non-negative integer; fix config.json")
        return value

    def token_id(self, name: str) -> int:
        """A token id field that transformers also accepts as a list: tmt has one EOS, so one id."""
        value = self.config.get(name, DEFAULTS.get(name))
        if isinstance(value, list):
            if len(value) != 1:
                raise HfError(f"{self.source}: {name}={_json(value)} lists several ids; tmt ends a sequence with one id")
            value = value[0]
        self.config = {**self.config, name: value}
        return self.integer(name)

    def same(self, encoder: str, decoder: str) -> int:
        enc, dec = self.integer(encoder), self.integer(decoder)
        if enc != dec:
            raise HfError(f"{self.source}: {encoder}={enc} differs from {decoder}={dec}; tmt uses one size for both stacks")
        return enc


def _json(value: object) -> str:
    """A value as config.json spells it (true, false, null), others as Python's repr."""
    return json.dumps(value) if isinstance(value, (bool, type(None))) else repr(value)
