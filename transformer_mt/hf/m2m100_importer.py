"""``tmt import --from m2m100-hf DIR -o model.pt``: an M2M100 / NLLB directory as a tmt checkpoint.

The MarianMT importer's steps (:mod:`~transformer_mt.hf.importer`), each check before anything its file asks for
is allocated: ``config.json`` mapped (:mod:`~transformer_mt.hf.m2m100_config`) and the whole config validated; the
model's size bounded; the model built on the ``meta`` device and every stored tensor's name, shape and dtype
compared with it from the safetensors headers (or the shards of ``model.safetensors.index.json``, or a weights-only
``pytorch_model.bin``); then the numbers read.

Tensor names (per layer as MarianMT's, :mod:`~transformer_mt.hf.weights`, with pre-norm): ``model.shared`` (also
found as ``model.encoder.embed_tokens`` / ``model.decoder.embed_tokens`` / ``lm_head``, the same matrix) is tmt's one
matrix ``src_embed`` = ``tgt_embed`` = ``output_proj``; ``model.encoder.layer_norm`` / ``model.decoder.layer_norm``
are ``encoder_norm`` / ``decoder_norm``.

The tokenizer: ``sentencepiece.bpe.model`` segments, and ``tokenizer.json`` (without it: M2M100Tokenizer's
``vocab.json`` and language tokens ``__fr__``, or NllbTokenizer's conversion of the sentencepiece model,
:func:`nllb_pieces`) gives each piece its id (NLLB's
fairseq layout: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, sentencepiece's piece i at i + 1, then the added
tokens: ``<mask>`` and the language codes, at the ids the file states). The language codes
(``tokenizer_config.json``'s ``extra_special_tokens`` or ``additional_special_tokens``) become
``model.decoder_languages``: the decoder's input is [``</s>``, code of the target language] + target.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from torch import Tensor

from transformer_mt.checkpoint import Importer, pack_tokenizers, save_checkpoint
from transformer_mt.config import (
    Config,
    DataConfig,
    DecodeConfig,
    TokenizerConfig,
    model_elements,
    quote,
    size_problem,
    to_dict,
    validate,
)
from transformer_mt.hf.errors import HfError, brief, require_transformers
from transformer_mt.hf.m2m100_config import model_config_from_m2m100
from transformer_mt.hf.vocab import MAX_VOCAB_BYTES, TOKENIZER_CONFIG, VOCAB, read_json, read_vocab
from transformer_mt.hf.weights import Layout, Stored, check_stored, map_layers, open_weights
from transformer_mt.model import Transformer
from transformer_mt.text import SpecialIds, Tokenizer, TokenizerError

SPM, TOKENIZER_JSON = "sentencepiece.bpe.model", "tokenizer.json"
# M2M100 saves its one matrix as model.shared; the others are the same matrix under the names its modules use.
SHARED = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:_[A-Z][a-z]{3})?|__[a-z]{2,3}__")  # NLLB's fra_Latn, M2M100's __fr__
NLLB_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq's dictionary: ids 0-3
FINAL_NORMS = {"encoder_norm": "model.encoder.layer_norm", "decoder_norm": "model.decoder.layer_norm"}


class M2M100Importer(Importer):
    """`tmt import --from m2m100-hf`: :func:`import_m2m100`."""

    def convert(self, directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
        return import_m2m100(directory, output, force=force)


def import_m2m100(directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """Write the M2M100 / NLLB model in ``directory`` as the tmt checkpoint ``output``; returns its path."""
    src_dir, out = Path(directory), Path(output)
    if not src_dir.is_dir():
        raise HfError(f"{src_dir}: not a directory; give the folder save_pretrained wrote (config.json, weights)")
    if out.is_dir():
        raise HfError(f"{out}: is a directory; give the checkpoint file to write, e.g. -o {out / 'model.pt'}")
    if out.exists() and not force:
        raise HfError(f"{out}: already exists; choose another -o file or pass --force to replace it")
    config_json = src_dir / "config.json"
    shape = model_config_from_m2m100(read_json(config_json), source=str(config_json))
    proto, vocab, languages = read_tokenizer(src_dir)
    if len(vocab) != shape.src_vocab_size:
        raise HfError(
            f"{src_dir / TOKENIZER_JSON}: lists {len(vocab)} pieces but config.json vocab_size={shape.src_vocab_size}; "
            "tmt needs one piece per embedding row"
        )
    unk = vocab.index("<unk>") if "<unk>" in vocab else -1
    if unk < 0:
        raise HfError(f"{src_dir / TOKENIZER_JSON}: has no piece <unk>; NLLB's tokenizer holds it at id 3")
    model_cfg = dataclasses.replace(shape.model, unk_id=unk, decoder_languages=" ".join(languages))
    cfg = Config(
        data=DataConfig(max_len=max(1, min(DataConfig().max_len, model_cfg.max_positions - 3))),
        tokenizer=TokenizerConfig(joint=True, vocab_size=len(vocab)),
        model=model_cfg,
        decode=DecodeConfig(beam=4),  # tmt's search settings: lenpen is GNMT's, not generate's length_penalty
    )
    problem = size_problem(model_elements(model_cfg, src_vocab_size=len(vocab), tgt_vocab_size=len(vocab)))
    if problem:
        raise HfError(f"{config_json}: d_model, the layers, the ffn dims and vocab_size make {problem}")
    validate(cfg, source=str(config_json), check_files=False)
    try:
        Tokenizer(proto, vocab=vocab, specials=SpecialIds.of(model_cfg))
    except (TokenizerError, RuntimeError) as exc:
        raise HfError(f"{src_dir / SPM}: not a usable sentencepiece model ({brief(exc)}); download it again") from None
    with torch.device("meta"):
        skeleton = Transformer(model_cfg, src_vocab_size=len(vocab), tgt_vocab_size=len(vocab))
    stored, weight_file = open_weights(src_dir)
    layout = m2m100_layout(skeleton, stored)
    check_stored(stored, layout, source=weight_file)
    state = _read_state(stored, layout)
    tokenizers = pack_tokenizers(proto, proto, src_vocab=vocab, tgt_vocab=vocab)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint({"model": state, "config": to_dict(cfg), "tokenizers": tokenizers}, out)


def read_tokenizer(directory: Path) -> tuple[bytes, list[str], list[str]]:
    """The sentencepiece model, the piece of every id (``tokenizer.json``: its model's vocabulary and added tokens)
    and the language codes, in the order the tokenizer lists them."""
    spm_path, json_path = directory / SPM, directory / TOKENIZER_JSON
    if not spm_path.is_file():
        raise HfError(f"{spm_path}: not found; NLLB's sentencepiece model belongs beside config.json")
    if spm_path.stat().st_size > MAX_VOCAB_BYTES:
        raise HfError(f"{spm_path}: more than {MAX_VOCAB_BYTES:,} bytes; download it again")
    proto = spm_path.read_bytes()
    if (directory / VOCAB).is_file() and not json_path.is_file():
        return proto, *_m2m100_vocab(directory)
    codes = _language_codes(directory / TOKENIZER_CONFIG)
    if not json_path.is_file():  # NllbTokenizer converts the sentencepiece model: its ids follow nllb_pieces
        return proto, nllb_pieces(proto, codes), codes
    table = read_json(json_path, max_bytes=MAX_VOCAB_BYTES)
    model = table.get("model")
    pieces = model.get("vocab") if isinstance(model, dict) else None
    added = table.get("added_tokens", [])
    if not isinstance(pieces, dict) or not isinstance(added, list):
        raise HfError(f"{json_path}: model.vocab must be an object and added_tokens a list; re-save the tokenizer")
    ids: dict[str, Any] = dict(pieces)
    for token in added:
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            raise HfError(f"{json_path}: an added token {quote(token)} has no content; re-save the tokenizer")
        ids[token["content"]] = token.get("id")
    listed: list[str | None] = [None] * len(ids)
    for piece, index in ids.items():
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(ids) or listed[index]:
            raise HfError(
                f"{json_path}: piece {quote(piece)} has id {quote(index)}; ids must be 0..{len(ids) - 1}, each once"
            )
        listed[index] = piece
    missing = [code for code in codes if code not in ids]
    if missing:
        raise HfError(f"{json_path}: the language code {quote(missing[0])} is not in it; re-save the tokenizer")
    return proto, [p for p in listed if p is not None], codes


def _m2m100_vocab(directory: Path) -> tuple[list[str], list[str]]:
    """M2M100Tokenizer's ids: ``vocab.json``, then ``__xx__`` for each language of transformers' list named by
    ``tokenizer_config.json``'s ``language_codes`` (m2m100: 100 languages), then ``num_madeup_words`` pieces
    that never occur (fairseq's ``madeupword0000`` ...), and those language tokens."""
    path = directory / TOKENIZER_CONFIG
    tok_config = read_json(path) if path.is_file() else {}
    table = require_transformers().models.m2m_100.tokenization_m2m_100.FAIRSEQ_LANGUAGE_CODES
    name, madeup = tok_config.get("language_codes", "m2m100"), tok_config.get("num_madeup_words", 8)
    if not isinstance(name, str) or name not in table:
        raise HfError(f"{path}: language_codes={quote(name)} is not one of {', '.join(table)}; re-save the tokenizer")
    if not isinstance(madeup, int) or isinstance(madeup, bool) or not 0 <= madeup <= 64:
        raise HfError(f"{path}: num_madeup_words={quote(madeup)} must be an integer from 0 to 64 (M2M100's: 8)")
    codes = [f"__{code}__" for code in table[name]]
    return read_vocab(directory / VOCAB) + codes + [f"madeupword{i:04d}" for i in range(madeup)], codes


def _language_codes(path: Path) -> list[str]:
    """The language codes ``tokenizer_config.json`` lists (``extra_special_tokens``, formerly
    ``additional_special_tokens``), in order."""
    tok_config = read_json(path) if path.is_file() else {}
    listed = tok_config.get("extra_special_tokens") or tok_config.get("additional_special_tokens") or []
    if not isinstance(listed, list):
        raise HfError(f'{path}: extra_special_tokens must be a list of language codes, e.g. ["fra_Latn"]')
    codes = [c.get("content") if isinstance(c, dict) else c for c in listed]
    for code in codes:
        if not isinstance(code, str) or not LANGUAGE_CODE.fullmatch(code):
            raise HfError(f"{path}: {quote(code)} is not a language code (e.g. fra_Latn); re-save the tokenizer")
    return [c for c in codes if isinstance(c, str)]


def nllb_pieces(proto: bytes, languages: list[str]) -> list[str]:
    """The piece of every id as NllbTokenizer converts a sentencepiece model with ``languages`` as its codes:
    fairseq's <s> <pad> </s> <unk>, sentencepiece's pieces from its fourth on (id + 1), <mask>, the codes."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return NLLB_SPECIALS + [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())] + ["<mask>", *languages]


def m2m100_layout(model: Transformer, stored: dict[str, Stored]) -> Layout:
    """The M2M100 tensors that make ``model``'s state dict (``model`` on the meta device), by name and shape."""
    cfg, expected = model.cfg, {name: tuple(t.shape) for name, t in model.state_dict().items()}
    parts: dict[str, tuple[str, ...]] = {}
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

    def one(ours: str, theirs: str) -> None:
        parts[ours], shapes[theirs] = (theirs,), (expected[ours],)

    shared = next((n for n in SHARED if n in stored), SHARED[0])
    for ours in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight"):
        one(ours, shared)
    for alias in SHARED:  # copies of the one matrix: checked, not read
        shapes.setdefault(alias, (expected["output_proj.weight"],))
    for ours, theirs in FINAL_NORMS.items():
        for kind in ("weight", "bias"):
            one(f"{ours}.{kind}", f"{theirs}.{kind}")
    map_layers(cfg, expected, parts, shapes)
    if set(expected) != set(parts):
        raise AssertionError(f"no M2M100 tensor for {sorted(set(expected) - set(parts))}")
    required = frozenset(name for names in parts.values() for name in names)
    return Layout(parts, shapes, required)


def _read_state(stored: dict[str, Stored], layout: Layout) -> dict[str, Tensor]:
    """The tmt state dict, float32, from tensors that passed :func:`check_stored`; the shared matrix read once."""
    read: dict[str, Tensor] = {}

    def get(name: str) -> Tensor:
        if name not in read:
            tensor = stored[name]
            try:
                read[name] = tensor.read().float()
            except Exception as exc:  # noqa: BLE001 - a file damaged after its header
                raise HfError(
                    f"{tensor.file}: tensor {name} cannot be read ({brief(exc)}); download it again"
                ) from None
        return read[name]

    out = {}
    for ours, names in layout.parts.items():
        out[ours] = get(names[0]) if len(names) == 1 else torch.cat([get(n) for n in names])
        if len(names) > 1:
            for n in names:
                read.pop(n)
    return out
