"""``tmt export --format m2m100-hf -o DIR``: a tmt checkpoint of M2M100's architecture as an M2M100 / NLLB directory.

``transformers.M2M100ForConditionalGeneration.from_pretrained(DIR)`` and ``NllbTokenizer.from_pretrained(DIR)``
load it with no custom code: ``config.json`` (:func:`~transformer_mt.hf.m2m100_config.m2m100_config`),
``generation_config.json``, ``model.safetensors`` (the importer's names, :mod:`~transformer_mt.hf.m2m100_importer`,
the one shared matrix as ``model.shared.weight``), ``sentencepiece.bpe.model`` and ``tokenizer_config.json``
(``NllbTokenizer`` with the checkpoint's language codes), and the ``tmt_export.json`` marker.

The tokenizer is rebuilt by transformers from the sentencepiece model, which gives NllbTokenizer's ids: ``<s>``,
``<pad>``, ``</s>``, ``<unk>``, sentencepiece's pieces from its fourth on, ``<mask>``, then the language codes; or,
for a model imported from M2M100Tokenizer's files (``__fr__`` codes), ``vocab.json`` and the name of transformers'
language list (:func:`m2m100_tokenizer_files`). A vocabulary of the same pieces in another order (NLLB-200's own puts
the codes before ``<mask>``) is written as ``tokenizer.json`` too: the tokenizer transformers builds from the
sentencepiece model, its ids replaced by the checkpoint's (:func:`tokenizer_json_with_ids`), which NllbTokenizer then
reads instead of converting. A vocabulary of other pieces is refused, in one line, rather than written with a
tokenizer whose ids would not be the model's.

Refused as well (:func:`~transformer_mt.hf.m2m100_config.m2m100_refusal`): any model section M2M100 cannot compute
(post-norm, other positions, an output bias, a restricted output layer, separate vocabularies).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import Tensor

from transformer_mt import __version__
from transformer_mt.checkpoint import Exporter, output_problem, staged_directory, write_export_marker
from transformer_mt.decoding import model_from_checkpoint
from transformer_mt.hf.errors import HfError, require_safetensors, require_transformers
from transformer_mt.hf.m2m100_config import m2m100_config, m2m100_refusal
from transformer_mt.hf.m2m100_importer import FINAL_NORMS, SPM, TOKENIZER_JSON, nllb_pieces
from transformer_mt.hf.vocab import TOKENIZER_CONFIG, VOCAB
from transformer_mt.hf.weights import ATTENTION, DECODER, ENCODER, SAFETENSORS
from transformer_mt.model import Transformer
from transformer_mt.text import Tokenizer

GENERATION_CONFIG = "generation_config.json"


class M2M100Exporter(Exporter):
    """`tmt export --format m2m100-hf`: :func:`export_m2m100`, float32 weights only."""

    def convert(
        self,
        checkpoint: str | os.PathLike,
        output: str | os.PathLike,
        *,
        quantization: str | None = None,
        force: bool = False,
    ) -> Path:
        if quantization is not None:
            raise HfError("--quantization applies to --format ctranslate2 only; m2m100-hf writes float32 weights")
        return export_m2m100(checkpoint, output, force=force)

    def summary(self, output: Path, *, quantization: str | None) -> str:  # noqa: ARG002 - always float32
        return (
            f"wrote {output} (m2m100-hf); load it with M2M100ForConditionalGeneration.from_pretrained and "
            "NllbTokenizer.from_pretrained"
        )


def export_m2m100(checkpoint: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``checkpoint`` (its EMA weights when it has them) as the M2M100 directory ``output``; returns it."""
    out = Path(output)
    problem = output_problem(out, force=force)
    if problem:
        raise HfError(problem)
    model, cfg, src_tok, tgt_tok, _ = model_from_checkpoint(checkpoint)
    refusal = m2m100_refusal(cfg.model)
    if refusal is None and src_tok != tgt_tok:
        refusal = "the source and target tokenizers differ; M2M100 has one vocabulary"
    languages = cfg.model.decoder_languages.split()
    m2m100 = m2m100_tokenizer_files(src_tok, languages, max_length=cfg.model.max_positions)
    converted, pieces = nllb_pieces(src_tok.proto, languages), src_tok.pieces()
    reordered = refusal is None and m2m100 is None and converted != pieces  # NLLB-200's own order, or another
    if reordered and (sorted(converted) != sorted(pieces) or len(set(pieces)) != len(pieces)):
        refusal = (
            "its vocabulary holds other pieces than NllbTokenizer's (<s> <pad> </s> <unk>, the sentencepiece pieces, "
            "<mask>, the model.decoder_languages codes) and is not M2M100Tokenizer's (vocab.json, __xx__ codes, "
            "made-up words)"
        )
    if refusal:
        raise HfError(f"{checkpoint}: cannot export to m2m100-hf: {refusal}")
    st = require_safetensors()
    m = cfg.model
    files: dict[str, object] = {
        "config.json": m2m100_config(m, vocab_size=src_tok.vocab_size),
        GENERATION_CONFIG: {
            "decoder_start_token_id": m.start_id,
            "bos_token_id": m.bos_id,
            "eos_token_id": m.eos_id,
            "pad_token_id": m.pad_id,
            "bad_words_ids": [[m.bos_id], [m.pad_id]],  # tmt's search never generates them
            "num_beams": cfg.decode.beam,
            **({"length_penalty": 0.0} if cfg.decode.lenpen == 0 else {}),
            "max_length": 512,
        },
        TOKENIZER_CONFIG: {
            "tokenizer_class": "NllbTokenizer",
            "extra_special_tokens": languages,
            "src_lang": languages[0] if languages else None,
            "legacy_behaviour": False,
            "model_max_length": m.max_positions,
        },
    }
    if m2m100 is not None:  # M2M100Tokenizer: vocab.json, and the language list by its name
        files[TOKENIZER_CONFIG], files[VOCAB] = m2m100
    notes = {
        "exported_by": f"transformer_mt {__version__}",
        "checkpoint": Path(checkpoint).name,
        "format": "m2m100-hf",
        "note": "generate(forced_bos_token_id=<target language code's id>) is tmt's --tgt-lang",
    }
    if reordered:
        files[TOKENIZER_JSON] = tokenizer_json_with_ids(src_tok.proto, files[TOKENIZER_CONFIG], pieces)
    with staged_directory(out) as staging:
        for name, content in files.items():
            (staging / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (staging / SPM).write_bytes(src_tok.proto)
        st.save_file(m2m100_state(model), str(staging / SAFETENSORS), metadata={"format": "pt"})
        write_export_marker(staging, notes)
    return out


def tokenizer_json_with_ids(proto: bytes, tok_config: object, pieces: list[str]) -> dict:
    """The ``tokenizer.json`` NllbTokenizer builds from the sentencepiece model ``proto`` and ``tok_config``, with
    every id (the model's vocabulary, the added tokens, the template's special tokens) replaced by the piece's index
    in ``pieces``: the same segmentation, the checkpoint's ids."""
    import tempfile

    ids = {piece: i for i, piece in enumerate(pieces)}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / SPM).write_bytes(proto)
        (Path(tmp) / TOKENIZER_CONFIG).write_text(json.dumps(tok_config), encoding="utf-8")
        built = require_transformers().NllbTokenizer.from_pretrained(tmp)
        table = json.loads(built.backend_tokenizer.to_str())
    vocab = table["model"]["vocab"]  # BPE: piece -> id
    table["model"]["vocab"] = {piece: ids[piece] for piece in vocab}
    for token in table.get("added_tokens", []):
        token["id"] = ids[token["content"]]
    post = table.get("post_processor") or {}
    for special in (post.get("special_tokens") or {}).values():
        special["ids"] = [ids[token] for token in special["tokens"]]
    return table


def m2m100_tokenizer_files(
    tok: Tokenizer, languages: list[str], *, max_length: int
) -> tuple[dict, dict[str, int]] | None:
    """``tokenizer_config.json`` and ``vocab.json`` of an M2M100Tokenizer giving ``tok``'s ids, or None when its
    vocabulary is not M2M100Tokenizer's: vocab.json's pieces, then ``languages`` (``__xx__``), one of transformers'
    language lists (``language_codes``) in its order, then made-up words."""
    if not languages or not all(code.startswith("__") and code.endswith("__") for code in languages):
        return None
    table = require_transformers().models.m2m_100.tokenization_m2m_100.FAIRSEQ_LANGUAGE_CODES
    name = next((n for n, codes in table.items() if [f"__{c}__" for c in codes] == languages), None)
    pieces = tok.pieces()
    start = pieces.index(languages[0]) if languages[0] in pieces else -1
    madeup = len(pieces) - start - len(languages)
    if name is None or start < 0 or pieces[start : start + len(languages)] != languages or madeup < 0:
        return None
    config = {
        "tokenizer_class": "M2M100Tokenizer",
        "language_codes": name,
        "num_madeup_words": madeup,
        "model_max_length": max_length,
    }
    return config, {piece: i for i, piece in enumerate(pieces[:start])}


def m2m100_state(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights under M2M100's names, contiguous float32 copies; the shared matrix once."""
    cfg = model.cfg
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {"model.shared.weight": state["src_embed.weight"]}
    for ours, theirs in FINAL_NORMS.items():
        for kind in ("weight", "bias"):
            out[f"{theirs}.{kind}"] = state[f"{ours}.{kind}"]
    for stack, count, plain in (("encoder", cfg.encoder_layers, ENCODER), ("decoder", cfg.decoder_layers, DECODER)):
        for i in range(count):
            hf, ours = f"model.{stack}.layers.{i}.", f"{stack}.{i}."
            for theirs, mine in ATTENTION[stack].items():
                for kind in ("weight", "bias"):  # tmt's fused [W^Q; W^K; W^V] rows
                    q, k, v = state[f"{ours}{mine}.in_{kind}"].split(cfg.d_model)
                    for p, part in (("q", q), ("k", k), ("v", v)):
                        out[f"{hf}{theirs}.{p}_proj.{kind}"] = part
                    out[f"{hf}{theirs}.out_proj.{kind}"] = state[f"{ours}{mine}.out.{kind}"]
            for theirs, mine in plain.items():
                for kind in ("weight", "bias"):
                    out[f"{hf}{theirs}.{kind}"] = state[f"{ours}{mine}.{kind}"]
    return {k: v.contiguous() for k, v in out.items()}
