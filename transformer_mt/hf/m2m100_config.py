"""M2M100's / NLLB's ``config.json`` and tmt's ``model`` section, both ways.

What maps (``transformers.M2M100Config`` field -> ``model.*`` key):

- ``d_model``, ``encoder_layers``, ``decoder_layers``, ``dropout``, ``attention_dropout``, ``activation_dropout``:
  the keys of the same meaning; ``encoder_attention_heads`` = ``decoder_attention_heads`` -> ``heads``;
  ``encoder_ffn_dim`` = ``decoder_ffn_dim`` -> ``d_ff``; ``activation_function`` relu, gelu, swish / silu;
- ``max_position_embeddings`` -> ``max_positions`` (tmt's table grows past it when decoding, as M2M100's does);
- ``vocab_size``: the one vocabulary (M2M100 shares it: ``model.shared``); ``tie_word_embeddings`` must be true
  (the output layer is that matrix, tmt's ``share_all_embeddings``);
- ``pad_token_id``, ``eos_token_id``, ``bos_token_id``, ``decoder_start_token_id`` -> ``pad_id``, ``eos_id``,
  ``bos_id``, ``decoder_start_id``;
- ``encoder_layerdrop`` / ``decoder_layerdrop``: LayerDrop skips whole layers in training only; tmt has none, so a
  model fine-tuned by tmt trains without it (decoding is the same: M2M100 never drops layers in eval);
- always: pre-norm layers with one final LayerNorm per stack (``model.norm: pre``; M2M100's ``layer_norm``),
  embeddings scaled by sqrt(d_model) (``scale_embedding`` must be true), fairseq's sinusoids
  (``model.position_layout: fairseq``) numbered from pad + 1 (``model.position_offset``: M2M100 counts positions from
  ``padding_idx + 1``), no output bias.

Anything else that would change what the model computes is refused in one line naming the field.
"""

from __future__ import annotations

from typing import Any

from transformer_mt.config import ModelConfig, quote
from transformer_mt.hf.errors import HfError
from transformer_mt.hf.marian_config import ACTIVATIONS, MarianShape, _Fields, _json, shape_fields

MODEL_TYPE = "m2m_100"
# Fields that must hold the value M2M100's code computes with, and why tmt cannot follow another.
FIXED_FIELDS: dict[str, tuple[object, str]] = {
    "scale_embedding": (True, "tmt always multiplies embeddings by sqrt(d_model)"),
    "tie_word_embeddings": (True, "tmt ties the output layer to M2M100's one shared embedding matrix"),
    "is_encoder_decoder": (True, "tmt imports encoder-decoder models"),
}
DEFAULTS: dict[str, object] = {
    "activation_function": "relu",
    "dropout": 0.1,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.05,
    "decoder_layerdrop": 0.05,
    "pad_token_id": 1,
    "eos_token_id": 2,
    "bos_token_id": 0,
    "decoder_start_token_id": 2,
    "max_position_embeddings": 1024,
}
# Fields of no consequence for the function the model computes (or written by save_pretrained for itself).
IGNORED = frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "init_std",
        "_name_or_path",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "tokenizer_class",
        "num_hidden_layers",
        "_from_model_config",
        "gradient_checkpointing",
        "max_length",
        "num_beams",
        "early_stopping",
        "forced_eos_token_id",
        "forced_bos_token_id",
        "id2label",
        "label2id",
        "chunk_size_feed_forward",
        "problem_type",
    }
)
MAPPED = frozenset(
    {
        *FIXED_FIELDS,
        *DEFAULTS,
        "d_model",
        "encoder_layers",
        "decoder_layers",
        "encoder_attention_heads",
        "decoder_attention_heads",
        "encoder_ffn_dim",
        "decoder_ffn_dim",
        "vocab_size",
    }
)
POSITION_OFFSET = 2  # M2M100SinusoidalPositionalEmbedding: positions start at padding_idx + 1, padding_idx 1


def model_config_from_m2m100(config: dict[str, Any], *, source: str = "config.json") -> MarianShape:
    """The ``model`` section and vocabulary size (source = target) of an M2M100 / NLLB ``config.json`` (a parsed
    dict). Raises HfError naming ``source`` and the field for what tmt cannot represent, a value of the wrong type,
    and sizes beyond :data:`~transformer_mt.config.LIMITS` (before anything is allocated)."""
    field = _Fields(config, source)
    model_type = field.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise HfError(f"{source}: model_type {quote(model_type)} is not m2m_100; use --from marian-hf for MarianMT")
    unknown = sorted(set(config) - MAPPED - IGNORED)
    if unknown:
        raise HfError(
            f"{source}: field {quote(unknown[0])} has no tmt equivalent ({len(unknown)} such); tmt imports the fields "
            "of transformers' M2M100Config"
        )
    for name, (want, why) in FIXED_FIELDS.items():
        value = field.get(name, want)
        if value != want or not isinstance(value, bool):
            raise HfError(
                f"{source}: {name}={_json(value)} cannot be imported ({why}); only {name}={_json(want)} maps to tmt"
            )
    activation = field.get("activation_function", DEFAULTS["activation_function"])
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise HfError(
            f"{source}: activation_function={_json(activation)} has no tmt equivalent; tmt has {', '.join(ACTIVATIONS)}"
        )
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        _fraction(field, name)
    heads = field.same("encoder_attention_heads", "decoder_attention_heads")
    d_ff = field.same("encoder_ffn_dim", "decoder_ffn_dim")
    vocab = field.size("vocab_size")
    d_model = field.size("d_model")
    if d_model % heads:
        raise HfError(f"{source}: d_model={d_model} is not divisible by encoder_attention_heads={heads}")
    if d_model < 4:
        raise HfError(f"{source}: d_model={d_model} is below 4; M2M100's sinusoids divide by d_model / 2 - 1")
    ids = {name: _token_id(field, name, vocab) for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    bos = _token_id(field, "bos_token_id", vocab)
    if len({ids["pad_token_id"], ids["eos_token_id"], bos}) != 3:
        raise HfError(f"{source}: pad_token_id, eos_token_id and bos_token_id must be three ids; fix config.json")
    model = ModelConfig(
        encoder_layers=field.size("encoder_layers"),
        decoder_layers=field.size("decoder_layers"),
        d_model=d_model,
        heads=heads,
        d_ff=d_ff,
        dropout=_fraction(field, "dropout"),
        attention_dropout=_fraction(field, "attention_dropout"),
        activation_dropout=_fraction(field, "activation_dropout"),
        activation=ACTIVATIONS[activation],
        norm="pre",
        positions="sinusoidal",
        position_layout="fairseq",
        position_offset=POSITION_OFFSET,
        max_positions=field.size("max_position_embeddings", default=1024, low=2),
        share_all_embeddings=True,
        share_decoder_embeddings=True,
        output_bias=False,
        pad_id=ids["pad_token_id"],
        unk_id=0,  # set from the tokenizer by the importer
        bos_id=bos,
        eos_id=ids["eos_token_id"],
        decoder_start_id=ids["decoder_start_token_id"],
    )
    return MarianShape(model, vocab, vocab)


def m2m100_config(cfg: ModelConfig, *, vocab_size: int) -> dict[str, Any]:
    """The ``config.json`` of an M2M100 model equal to ``cfg`` (:func:`m2m100_refusal` must have passed)."""
    return {
        "architectures": ["M2M100ForConditionalGeneration"],
        "model_type": MODEL_TYPE,
        **shape_fields(cfg),
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,
        "tie_word_embeddings": True,
        "vocab_size": vocab_size,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "bos_token_id": cfg.bos_id,
        "decoder_start_token_id": cfg.start_id,
        "is_encoder_decoder": True,
        "init_std": 0.02,
        "use_cache": True,
        "dtype": "float32",
    }


def m2m100_refusal(cfg: ModelConfig) -> str | None:
    """Why ``cfg`` cannot be written as an M2M100 model (one clause naming the key), or None."""
    wanted = {
        "norm": "pre",
        "positions": "sinusoidal",
        "position_layout": "fairseq",
        "position_offset": POSITION_OFFSET,
        "share_all_embeddings": True,
        "output_bias": False,
        "restrict_output": False,
    }
    for key, want in wanted.items():
        if getattr(cfg, key) != want:
            return f"model.{key}={getattr(cfg, key)}: M2M100 has only model.{key}={want}"
    size = cfg.d_model // cfg.heads
    if cfg.d_model % cfg.heads or (cfg.head_dim or size) != size or (cfg.value_dim or size) != size:
        return f"model.head_dim / model.value_dim: M2M100's heads are d_model / heads={cfg.heads} wide"
    if cfg.bos_id < 0 or len({cfg.pad_id, cfg.eos_id, cfg.bos_id}) != 3:
        return "model.bos_id: M2M100 has distinct bos, pad and eos ids"
    return None


def _fraction(field: _Fields, name: str) -> float:
    value = field.get(name, DEFAULTS[name])
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise HfError(f"{field.source}: {name}={_json(value)} must be a number in [0, 1), e.g. 0.1; fix config.json")
    return float(value)


def _token_id(field: _Fields, name: str, vocab_size: int) -> int:
    value = field.get(name, DEFAULTS[name])
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
        raise HfError(
            f"{field.source}: {name}={_json(value)} must be an id of the vocabulary (0 to {vocab_size - 1}); "
            "fix config.json"
        )
    return value
