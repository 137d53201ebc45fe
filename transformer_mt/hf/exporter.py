"""``tmt export --format marian-hf -o DIR``: a tmt checkpoint as a MarianMT directory.

``transformers.MarianMTModel.from_pretrained(DIR)`` and ``MarianTokenizer.from_pretrained(DIR)`` load it with no
custom code: ``config.json`` (:func:`~transformer_mt.hf.marian_config.marian_config`), ``generation_config.json``,
``model.safetensors`` (:func:`~transformer_mt.hf.weights.marian_state`), ``source.spm`` / ``target.spm``,
``vocab.json`` (and ``target_vocab.json`` when the two sides have different vocabularies),
``tokenizer_config.json``, and ``tmt_export.json``, the marker whose content hashes let ``--force`` replace an earlier
export while its files are unchanged.

``generation_config.json`` asks ``generate`` for tmt's search where the two can agree: PAD, BOS and the decoder's
start are never generated (``bad_words_ids``; tmt's search masks them too, without renormalising), no forced EOS at
the length limit, the checkpoint's beam, and ``length_penalty`` 0 when ``decode.lenpen`` is 0. transformers divides
a hypothesis' log-prob by len**length_penalty, tmt by GNMT's ((5 + len) / 6)**lenpen: both are the plain sum at 0
and differ otherwise, so another lenpen is left to transformers' default and noted in tmt_export.json.

Refused, in one line saying why (:func:`~transformer_mt.hf.marian_config.marian_refusal`): pre-norm and ScaleNorm
models, learned positions, heads of another width than d_model / heads. The directory is written beside ``DIR``
and renamed into place, as ``tmt export --format ctranslate2`` does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformer_mt import __version__
from transformer_mt.checkpoint import Exporter, output_problem, staged_directory, write_export_marker
from transformer_mt.config import ModelConfig
from transformer_mt.decoding import model_from_checkpoint
from transformer_mt.hf.errors import HfError, require_safetensors
from transformer_mt.hf.marian_config import marian_config, marian_refusal
from transformer_mt.hf.vocab import (
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    TOKENIZER_CONFIG,
    VOCAB,
    tokenizer_config,
    vocab_json,
)
from transformer_mt.hf.weights import SAFETENSORS, marian_state
from transformer_mt.text import NO_ID

GENERATION_CONFIG = "generation_config.json"


class MarianExporter(Exporter):
    """`tmt export --format marian-hf`: :func:`export_marian`, float32 weights only."""

    def convert(
        self,
        checkpoint: str | os.PathLike,
        output: str | os.PathLike,
        *,
        quantization: str | None = None,
        force: bool = False,
    ) -> Path:
        if quantization is not None:  # refused before anything is read
            raise HfError("--quantization applies to --format ctranslate2 only; marian-hf writes float32 weights")
        return export_marian(checkpoint, output, force=force)

    def summary(self, output: Path, *, quantization: str | None) -> str:  # noqa: ARG002 - always float32
        return (
            f"wrote {output} (marian-hf); load it with MarianMTModel.from_pretrained and "
            "MarianTokenizer.from_pretrained"
        )


def export_marian(checkpoint: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``checkpoint`` (its EMA weights when it has them, as ``tmt translate`` decodes) as the MarianMT
    directory ``output``; returns it. An existing ``output`` is replaced only with ``force``, and only if an
    earlier export wrote it."""
    out = Path(output)
    problem = output_problem(out, force=force)
    if problem:
        raise HfError(problem)
    model, cfg, src_tok, tgt_tok, _ = model_from_checkpoint(checkpoint)
    refusal = marian_refusal(cfg.model)
    if refusal:
        raise HfError(f"{checkpoint}: cannot export to marian-hf: {refusal}")
    st = require_safetensors()
    separate = src_tok.pieces() != tgt_tok.pieces()
    files = {
        "config.json": marian_config(cfg.model, src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size),
        GENERATION_CONFIG: generation_config(cfg.model, beam=cfg.decode.beam, lenpen=cfg.decode.lenpen),
        VOCAB: vocab_json(src_tok),
        TOKENIZER_CONFIG: tokenizer_config(src_tok, tgt_tok, separate=separate, max_length=cfg.model.max_positions),
    }
    notes = {
        "exported_by": f"transformer_mt {__version__}",
        "checkpoint": Path(checkpoint).name,  # its name, not where it lives on this machine
        "format": "marian-hf",
        "tmt_decode": {
            "beam": cfg.decode.beam,
            "lenpen": cfg.decode.lenpen,
            "max_len_a": cfg.decode.max_len_a,
            "max_len_b": cfg.decode.max_len_b,
        },
        "note": (
            "tmt's lenpen is GNMT ((5+len)/6)^alpha, transformers' length_penalty divides by len^alpha: the two agree "
            "only at 0; tmt's longest output is floor(a * (pieces + 1) + b) per line, generate's max_new_tokens one "
            "number per call"
        ),
    }
    if separate:
        files[TARGET_VOCAB] = vocab_json(tgt_tok)
    with staged_directory(out) as staging:
        for name, content in files.items():
            (staging / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (staging / SOURCE_SPM).write_bytes(src_tok.proto)
        (staging / TARGET_SPM).write_bytes(tgt_tok.proto)
        st.save_file(
            marian_state(model), str(staging / SAFETENSORS), metadata={"format": "pt"}
        )  # "pt": what from_pretrained expects
        write_export_marker(staging, notes)
    return out


def generation_config(model_cfg: ModelConfig, *, beam: int, lenpen: float) -> dict:
    """``generation_config.json``: the search settings of tmt's that ``generate`` can follow (module docstring)."""
    never = sorted({i for i in (model_cfg.pad_id, model_cfg.bos_id, model_cfg.start_id) if i != NO_ID})
    out = {
        "decoder_start_token_id": model_cfg.start_id,
        "eos_token_id": model_cfg.eos_id,
        "pad_token_id": model_cfg.pad_id,
        "bad_words_ids": [[i] for i in never],
        "forced_eos_token_id": None,
        "num_beams": beam,
        "max_length": 512,
        "renormalize_logits": False,
    }
    if lenpen == 0:
        out["length_penalty"] = 0.0
    return out
