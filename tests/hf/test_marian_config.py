"""config.json <-> the model section: the mapping both ways, and the one-line refusals (no transformers needed)."""

from __future__ import annotations

import dataclasses

import pytest

from transformer_mt.config import ModelConfig
from transformer_mt.hf import HfError
from transformer_mt.hf.marian_config import marian_config, marian_refusal, model_config_from_marian

MARIAN = ModelConfig(
    encoder_layers=3, decoder_layers=2, d_model=48, heads=6, d_ff=96, activation="swish", position_layout="halves",
    max_positions=512, share_all_embeddings=False, output_bias=True, pad_id=99, unk_id=1, bos_id=-1, eos_id=0,
    decoder_start_id=99,
)  # fmt: skip


def test_config_json_round_trip():
    config = marian_config(MARIAN, src_vocab_size=100, tgt_vocab_size=120)
    shape = model_config_from_marian(config, unk_id=1)
    assert (shape.src_vocab_size, shape.tgt_vocab_size) == (100, 120)
    assert shape.model == dataclasses.replace(MARIAN, dropout=shape.model.dropout)
    assert (
        config["decoder_vocab_size"] == 120
        and config["share_encoder_decoder_embeddings"] is False
        and config["tie_word_embeddings"] is True
    )


def test_opus_mt_config_fields():
    """The fields an OPUS-MT config.json of the conversion era carries (values of Helsinki-NLP/opus-mt-en-de's)."""
    config = {
        "model_type": "marian", "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
        "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "activation_function": "swish",
        "vocab_size": 58101, "pad_token_id": 58100, "decoder_start_token_id": 58100, "eos_token_id": 0,
        "bos_token_id": 0, "max_position_embeddings": 512, "scale_embedding": True, "static_position_embeddings": True,
        "normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
        "add_bias_logits": False, "dropout": 0.1,
    }  # fmt: skip
    model = model_config_from_marian(config, unk_id=1).model
    assert (model.pad_id, model.eos_id, model.bos_id, model.start_id, model.unk_id) == (
        58100,
        0,
        -1,
        58100,
        1,
    )  # bos 0 is EOS: no BOS
    assert model.share_all_embeddings and model.share_decoder_embeddings and model.activation == "swish"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"share_encoder_decoder_embeddings": True, "tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"eos_token_id": [0, 5]}, "eos_token_id"),
        ({"encoder_layerdrop": 0.1}, "encoder_layerdrop"),
        ({"pad_token_id": 500}, "pad_token_id"),
        ({"d_model": 50}, "d_model"),
        ({"activation_function": "gelu_fast"}, "activation_function"),
        ({"activation_function": []}, "activation_function"),
        ({"dropout": "x"}, "dropout"),
        ({"dropout": None}, "dropout"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"encoder_attention_heads": 0, "decoder_attention_heads": 0}, "encoder_attention_heads"),
        ({"d_model": 6 << 17}, "d_model"),  # divisible by the 6 heads, past the limit
        ({"encoder_layers": 10**40}, "encoder_layers"),
        ({"max_position_embeddings": 1}, "max_position_embeddings"),
        ({"scale_embedding": 1}, "scale_embedding"),
        ({"share_encoder_decoder_embeddings": "yes"}, "share_encoder_decoder_embeddings"),
        ({"decoder_start_token_id": 0}, "decoder_start_token_id"),  # the EOS id
        ({"pad_token_id": 1}, "pad_token_id"),  # the UNK id
        ({"bos_token_id": 10**6}, "bos_token_id"),
        ({"d_model": None}, "d_model"),
    ],
)
def test_refused_naming_the_field(change, field):
    config = {**marian_config(MARIAN, src_vocab_size=100, tgt_vocab_size=120), **change}
    with pytest.raises(HfError, match=field) as info:
        model_config_from_marian(config, unk_id=1, source="m/config.json")
    assert str(info.value).startswith("m/config.json: ") and "\n" not in str(info.value)


def test_a_refusal_quotes_a_long_value_short():
    config = {
        **marian_config(MARIAN, src_vocab_size=100, tgt_vocab_size=120),
        "normalize_before": ["x" * 10_000] * 1000,
    }
    with pytest.raises(HfError, match="normalize_before") as info:
        model_config_from_marian(config, unk_id=1, source="m/config.json")
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"norm": "pre"}, "model.norm=pre"),
        ({"norm": "scale"}, "model.norm=scale"),
        ({"positions": "learned"}, "model.positions"),
        ({"head_dim": 16}, "head_dim"),
    ],
)
def test_export_refusals_say_why(change, words):
    reason = marian_refusal(dataclasses.replace(MARIAN, **change))
    assert reason is not None and words in reason and "\n" not in reason
    assert (
        marian_refusal(MARIAN) is None
        and marian_refusal(dataclasses.replace(MARIAN, position_layout="interleaved")) is None
    )
