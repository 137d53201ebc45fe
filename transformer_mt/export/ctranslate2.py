"""A tmt checkpoint as a CTranslate2 model directory, through CTranslate2's documented converter API.

How each piece of :class:`~transformer_mt.model.transformer.Transformer` lands in a ``TransformerSpec`` (the same
mapping as CTranslate2's own fairseq and OpenNMT-py converters; tests/test_export.py checks the
result token for token against tmt's own search):

- ``MultiHeadAttention.in_weight`` holds the rows [W^Q; W^K; W^V]: self-attention passes it whole as
  the fused ``linear[0]``; cross-attention splits it into ``linear[0]`` = W^Q and the fused
  ``linear[1]`` = [W^K; W^V]; W^O is ``linear[-1]``. CTranslate2 scales queries by 1/sqrt(d_k) itself.
- Each sublayer's LayerNorm is that sublayer's ``layer_norm``; the spec's ``pre_norm`` flag says
  whether it applies before the sublayer or after the residual add, as ``model.norm`` does here.
  Pre-norm's final norm per stack is the stack's ``layer_norm``.
- Embeddings are multiplied by sqrt(d_model) (section 3.4: ``scale_embeddings``); the positions are
  written explicitly, as tmt's table in either ``model.position_layout``: CTranslate2's built-in sinusoids
  put all sines before all cosines but with fairseq's frequencies 10000^(-i/(d/2 - 1)), neither the paper's
  (section 3.5, interleaved) nor MarianMT's (halves, 10000^(-2i/d)). Learned positions are their table.
- The FFN activation maps by name: relu to RELU, gelu (torch's exact erf GELU) to GELU, swish (SiLU) to SWISH.
- ``output_proj`` is the decoder's ``projection``; when it is tied to the embedding, CTranslate2's
  optimiser stores the one array once (it aliases equal variables). ``model.output_bias`` is its bias.
- Vocabularies are the pieces in id order (the tokenizer's), so a CTranslate2 id is the tmt id; the
  config's unk / bos / eos tokens are the pieces at the model's special ids; ``decoder_start_token``
  is the piece the decoder starts from (BOS for tmt's own models); ``add_source_eos`` appends EOS to the source
  (tmt's source is pieces + EOS); decoding stops at EOS. A joint vocabulary is saved once.
- LayerNorm epsilon is torch's 1e-5, written into the config.
- ``model.norm: scale`` (ScaleNorm + FixNorm): CTranslate2 has no ScaleNorm but has RMSNorm (``rms_norm``), and
  g x / max(||x||, eps) = (g / sqrt(d)) x / rms(x): each ScaleNorm becomes an RMSNorm whose gain vector is
  g / sqrt(d), with epsilon 1e-12 (RMSNorm adds it to mean(x^2); the two differ only for vectors near 0).
  FixNorm's unit-length rows are constants at inference: the normalised embedding and output matrices are written.
- ``model.restrict_output``: the output layer is written over the full vocabulary (every row of the matrix, which
  a tied embedding holds anyway) with a bias of -1e9 on the pieces not kept (the output bias, or 0, on the
  others), which makes their probability exactly 0 in float32 softmax, as tmt's -inf logits do.

``ctranslate2`` is imported only inside the functions here; without it, the user is told which
extra to install.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_mt import __version__
from transformer_mt.checkpoint import EXPORT_MARKER, Exporter, output_problem, staged_directory, write_export_marker
from transformer_mt.config import Config, to_dict
from transformer_mt.decoding import model_from_checkpoint, positions_needed
from transformer_mt.export.errors import ExportError
from transformer_mt.model import MultiHeadAttention, ScaleNorm, Transformer, count_parameters, sinusoids
from transformer_mt.text import NO_ID, Tokenizer

INSTALL_HINT = 'ctranslate2 is not installed; run: pip install -e ".[export]"'
# Which sentencepiece model(s) go into the directory, for tokenizing before and detokenizing after.
JOINT_SPM, SOURCE_SPM, TARGET_SPM = "sentencepiece.model", "source.model", "target.model"
README_FILE = EXPORT_MARKER


def require_ctranslate2():
    """The ``ctranslate2`` module, or an ExportError naming the install command."""
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(INSTALL_HINT) from None
    return ctranslate2


def export_ctranslate2(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    quantization: str | None = None,
    force: bool = False,
    weights: str | None = None,
    notes: dict[str, Any] | None = None,
    never_generated: bool = False,
) -> Path:
    """Write ``checkpoint`` as a CTranslate2 model directory (model.bin, config.json, vocabularies,
    the sentencepiece model(s) and ``tmt_export.json``); weights quantized to ``quantization``
    (int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16, float32; None keeps float32).
    ``weights``: ema, raw or None (the EMA weights when the checkpoint has them); ``notes``: more keys for
    ``tmt_export.json`` (the engine's conversion cache records what it was converted from); ``never_generated``: the
    ids tmt's search never generates are never generated by the exported model either (:func:`build_spec`)."""
    ct2 = require_ctranslate2()
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise ExportError(f"--quantization {quantization!r} is not one of {', '.join(ACCEPTED_MODEL_TYPES)}")
    out = Path(out_dir)
    problem = output_problem(out, force=force)
    if problem:
        raise ExportError(problem)
    model, cfg, src_tok, tgt_tok, _ = model_from_checkpoint(
        checkpoint, weights=weights
    )  # None: the EMA weights when the checkpoint has them
    src_proto, tgt_proto = src_tok.proto, tgt_tok.proto

    # ctranslate2 is imported at run time (an optional extra), so mypy does not know its classes
    class _Converter(ct2.converters.Converter):  # type: ignore[name-defined]
        """CTranslate2's converter protocol: ``_load`` returns the filled spec; ``convert`` validates,
        quantizes and saves it (and refuses or replaces an existing directory)."""

        def __init__(self, spm_dir: Path):
            self.spm_dir = spm_dir

        def _load(self):
            spec = build_spec(model, src_tok, tgt_tok, config=cfg, never_generated=never_generated)
            for name, proto in _spm_files(src_proto, tgt_proto).items():
                path = self.spm_dir / name
                path.write_bytes(proto)
                spec.register_file(str(path), name)
            return spec

    # Written beside `out` and renamed into place: a failed export leaves `out` as it was, and the
    # converter's own force (which deletes whatever directory it is given) only ever meets our temporary.
    with staged_directory(out) as staging, tempfile.TemporaryDirectory() as spm_dir:
        _Converter(Path(spm_dir)).convert(str(staging), quantization=quantization, force=True)
        written = describe(
            cfg, checkpoint=Path(checkpoint).name, quantization=quantization, joint=src_proto == tgt_proto
        )
        written.update(
            parameters=count_parameters(model),
            weights=weights or "default",
            vocab_ids=[src_tok.vocab is not None, tgt_tok.vocab is not None],
        )
        written["config"] = decoding_config(cfg)
        write_export_marker(staging, written | (notes or {}))
    return out


class CTranslate2Exporter(Exporter):
    """`tmt export --format ctranslate2`: :func:`export_ctranslate2` with the checkpoint's default weights."""

    def convert(
        self,
        checkpoint: str | os.PathLike,
        output: str | os.PathLike,
        *,
        quantization: str | None = None,
        force: bool = False,
    ) -> Path:
        return export_ctranslate2(checkpoint, output, quantization=quantization, force=force)

    def summary(self, output: Path, *, quantization: str | None) -> str:
        return (
            f"wrote {output} (ctranslate2, {quantization or 'float32'}); see {output / EXPORT_MARKER} for how to "
            "decode like tmt"
        )


def decoding_config(cfg: Config) -> dict[str, Any]:
    """The part of the checkpoint's config that decoding the directory like tmt needs (``from_dict`` reads it back):
    the model section (special ids, positions, limits), the decode defaults, data.max_len, which the config's
    checks compare with model.max_positions, and the corpora's languages and tags (a multilingual model's sources
    start with a language tag), each file named without its directory. Not the rest: data, tokenizer and run paths
    of the machine that trained it."""
    sections = to_dict(cfg)
    data: dict[str, Any] = {"max_len": cfg.data.max_len}
    if cfg.data.corpora:
        data["corpora"] = [
            {**corpus, "src": Path(corpus["src"]).name, "tgt": Path(corpus["tgt"]).name}
            for corpus in sections["data"]["corpora"]
        ]
    return {"model": sections["model"], "decode": sections["decode"], "data": data}


def _spm_files(src_proto: bytes, tgt_proto: bytes) -> dict[str, bytes]:
    return {JOINT_SPM: src_proto} if src_proto == tgt_proto else {SOURCE_SPM: src_proto, TARGET_SPM: tgt_proto}


def build_spec(
    model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer, *, config: Config, never_generated: bool = False
):
    """A filled ``ctranslate2.specs.TransformerSpec`` for ``model`` (float32 weights, tmt's special tokens);
    ``config`` (the checkpoint's Config) sizes the sinusoid table. ``never_generated``: the ids tmt's search never
    generates (padding, the decoder's start, BOS) get an output bias of -1e9, as ``suppress_sequences`` would
    remove them at every step but at no cost per step (both renormalize the softmax over the other ids)."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    # the layers' submodules by name (EncoderLayer, DecoderLayer): typed Any, as nn.Module attributes are dynamic
    encoder_layers: list[Any] = list(model.encoder)
    decoder_layers: list[Any] = list(model.decoder)
    attn: MultiHeadAttention = (encoder_layers or decoder_layers)[0].self_attn
    if cfg.decoder_languages or cfg.position_offset:  # an M2M100 / NLLB model: its target language on the decoder
        raise ExportError(
            "model.decoder_languages / model.position_offset: an NLLB / M2M100 model's decoder starts with its target "
            "language, which tmt's CTranslate2 export does not write; export it with --format m2m100-hf"
        )
    if attn.dk != attn.dv:
        raise ExportError(
            f"model.head_dim={attn.dk} differs from model.value_dim={attn.dv}; CTranslate2 needs one size per head for "
            "queries, keys and values"
        )
    head_dim = None if attn.dk * cfg.heads == cfg.d_model else attn.dk  # only a non-default size is declared
    common = dict(
        pre_norm=cfg.norm != "post",
        rms_norm=cfg.norm == "scale",
        activation=_activation(common_spec, cfg.activation),
        head_dim=head_dim,
    )
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, **common),
        transformer_spec.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, **common),
    )
    positions = _position_table(model, config)
    _set_stack_inputs(spec.encoder, model.src_embed, positions, embed_list=True, fix_norm=model.fix_norm)
    _set_stack_inputs(spec.decoder, model.tgt_embed, positions, embed_list=False, fix_norm=model.fix_norm)
    for layer_spec, layer in zip(spec.encoder.layer, encoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.norm2)
    for layer_spec, layer in zip(spec.decoder.layer, decoder_layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.norm2)
        _set_ffn(layer_spec.ffn, layer.ffn, layer.norm3)
    if model.encoder_norm is not None and model.decoder_norm is not None:  # pre-norm: one final norm per stack
        _set_norm(spec.encoder.layer_norm, model.encoder_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder_norm)
    weight = model.output_proj.weight
    spec.decoder.projection.weight = _np(
        torch.nn.functional.normalize(weight, dim=-1) if model.fix_norm else weight
    )  # (V, D)
    bias: torch.Tensor | None = model.output_proj.bias  # (V,) with model.output_bias, else None
    if model.output_ids is not None:  # restrict_output: the pieces not kept can never be produced
        kept = torch.zeros(weight.size(0)) if bias is None else bias.detach().float().cpu()
        bias = torch.full((weight.size(0),), -1e9).index_copy_(
            0, model.output_ids.cpu(), kept[model.output_ids.cpu()]
        )  # (V,)
    if never_generated:
        bias = torch.zeros(weight.size(0)) if bias is None else bias.detach().float().cpu().clone()
        bias[list(model.specials.never_generated)] = -1e9  # (V,)
    if bias is not None:
        spec.decoder.projection.bias = _np(bias)

    spec.register_source_vocabulary(_pieces(src_tok))
    spec.register_target_vocabulary(_pieces(tgt_tok))
    piece, ids = tgt_tok.id_to_piece, model.specials
    spec.config.unk_token, spec.config.eos_token = piece(ids.unk), piece(ids.eos)
    if ids.bos != NO_ID:
        spec.config.bos_token = piece(ids.bos)
    spec.config.decoder_start_token = piece(ids.start)  # tmt's decoder input is start + target (data.collate)
    spec.config.add_source_eos = True  # tmt's source is pieces + EOS (data.source_tensor)
    spec.config.add_source_bos = False
    # torch.nn.LayerNorm's default, which tmt trains with; RMSNorm standing for ScaleNorm: next to nothing (module
    # docstring)
    spec.config.layer_norm_epsilon = 1e-12 if cfg.norm == "scale" else 1e-5
    if src_tok.id_to_piece(ids.eos) != piece(ids.eos):
        raise ExportError(
            f"source EOS piece {src_tok.id_to_piece(ids.eos)!r} differs from target EOS piece {piece(ids.eos)!r}; "
            "CTranslate2 has one eos_token for both: retrain the tokenizers with `tmt tokenize train`"
        )
    return spec


def _activation(common_spec, name: str):
    # torch's F.gelu is the exact (erf) GELU, CTranslate2's Activation.GELU; not GELUTanh.
    return {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
    }[name]


def _position_table(model: Transformer, cfg: Config) -> np.ndarray:
    """(P, D) position vectors, row p for position p (the first token is position 0, as in tmt).

    Learned positions: the trained table (P = model.max_positions). Sinusoids extend to any length in
    tmt, but CTranslate2 needs a finite table: P is what tmt's Translator reserves when it loads the
    checkpoint, the longest accepted source (max_positions) and the longest output decode.max_len_a/b
    allow for it (1074 rows for max_positions 1024, a = 1, b = 50)."""
    if model.learned_positions:
        return _np(model.pos_embed.weight)
    rows = positions_needed(cfg.model.max_positions, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b)
    return sinusoids(rows, cfg.model.d_model, layout=cfg.model.position_layout).numpy()


def _set_stack_inputs(
    stack_spec, embed: torch.nn.Embedding, positions: np.ndarray, *, embed_list: bool, fix_norm: bool
) -> None:
    weight = (
        torch.nn.functional.normalize(embed.weight, dim=-1) if fix_norm else embed.weight
    )  # FixNorm: unit rows (PAD's stays 0)
    (stack_spec.embeddings[0] if embed_list else stack_spec.embeddings).weight = _np(weight)
    stack_spec.scale_embeddings = True  # multiply by sqrt(d_model), section 3.4
    stack_spec.position_encodings.encodings = positions


def _set_self_attention(spec, attn: MultiHeadAttention, norm: torch.nn.Module) -> None:
    spec.linear[0].weight, spec.linear[0].bias = (
        _np(attn.in_weight),
        _np(attn.in_bias),
    )  # (H*(2Dk+Dv), D) = [W^Q; W^K; W^V]
    _set_linear(spec.linear[1], attn.out)
    _set_norm(spec.layer_norm, norm)


def _set_cross_attention(spec, attn: MultiHeadAttention, norm: torch.nn.Module) -> None:
    n = attn.sizes[0]  # rows of W^Q; the encoder side projects [W^K; W^V] in one matmul
    spec.linear[0].weight, spec.linear[0].bias = _np(attn.in_weight[:n]), _np(attn.in_bias[:n])
    spec.linear[1].weight, spec.linear[1].bias = _np(attn.in_weight[n:]), _np(attn.in_bias[n:])
    _set_linear(spec.linear[2], attn.out)
    _set_norm(spec.layer_norm, norm)


def _set_ffn(spec, ffn, norm: torch.nn.Module) -> None:
    _set_linear(spec.linear_0, ffn.fc1)
    _set_linear(spec.linear_1, ffn.fc2)
    _set_norm(spec.layer_norm, norm)


def _set_linear(spec, linear: torch.nn.Linear) -> None:
    spec.weight = _np(linear.weight)
    if linear.bias is not None:
        spec.bias = _np(linear.bias)


def _set_norm(spec, norm: torch.nn.Module) -> None:
    if isinstance(norm, ScaleNorm):  # as the RMSNorm gain g / sqrt(d) (module docstring); RMSNorm has no beta
        spec.gamma = np.full(norm.d_model, norm.g.item() / np.sqrt(norm.d_model), dtype=np.float32)
    elif isinstance(norm, torch.nn.LayerNorm):
        spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)
    else:
        raise ExportError(
            f"{type(norm).__name__}: a norm CTranslate2 has no equivalent for; export supports LayerNorm and ScaleNorm"
        )


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().copy()


def _pieces(tok: Tokenizer) -> list[str]:
    return tok.pieces()


def describe(cfg: Config, *, checkpoint: str, quantization: str | None, joint: bool) -> dict:
    """What ``tmt_export.json`` says: where the model came from and how to decode it like tmt."""
    d = cfg.decode
    return {
        "exported_by": f"transformer_mt {__version__}",
        "checkpoint": checkpoint,
        "quantization": quantization or "float32",
        "sentencepiece": [JOINT_SPM] if joint else [SOURCE_SPM, TARGET_SPM],
        "source": "sentencepiece pieces of one line (no BOS/EOS: the model config appends EOS)",
        # CTranslate2's max_input_length counts the EOS it appends: max_positions keeps max_positions - 1 pieces, as
        # tmt does.
        "max_input_length": cfg.model.max_positions,
        "tmt_decode": {"beam": d.beam, "lenpen": d.lenpen, "max_len_a": d.max_len_a, "max_len_b": d.max_len_b},
        "note": (
            "tmt's lenpen is GNMT ((5+len)/6)^alpha, CTranslate2's length_penalty divides by len^alpha: "
            "the two agree exactly only at 0; tmt's maximum output is floor(a * (pieces + 1) + b) per line, "
            "CTranslate2's max_decoding_length one number per call"
        ),
    }
