"""MarianMT's vocabulary and tokenizer files: ``vocab.json`` (and ``target_vocab.json``), ``tokenizer_config.json``.

``vocab.json`` maps each piece to its id (OPUS-MT: ``</s>`` 0, ``<unk>`` 1, the pieces of both sentencepiece
models, ``<pad>`` last); ``MarianTokenizer`` segments with ``source.spm`` / ``target.spm`` and looks every piece up
there (a piece not listed is ``<unk>``), so tmt keeps the list, piece at index = id, beside the sentencepiece models
(:class:`transformer_mt.text.Tokenizer` with ``vocab``). A model with ``separate_vocabs`` (tokenizer_config.json)
looks target pieces up in ``target_vocab.json``. A tmt-trained model's vocabulary is its sentencepiece pieces in id
order, so MarianTokenizer gives the ids sentencepiece gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_mt.config import quote
from transformer_mt.hf.errors import HfError, brief
from transformer_mt.text import Tokenizer

VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG = "vocab.json", "target_vocab.json", "tokenizer_config.json"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
# MarianTokenizer's default special pieces (tokenizer_config.json may name others)
SPECIAL_PIECES = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
# The most a file is read whole: a config (config.json, tokenizer_config.json, generation_config.json, a weight index,
# a safetensors header) is a few KB to a few MB; vocab.json lists at most tokenizer.vocab_size's limit of pieces (2^21,
# ~25 bytes each), and a sentencepiece model holds as many.
MAX_CONFIG_BYTES = 16 << 20
JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
MAX_VOCAB_BYTES = 64 << 20


def read_json(path: Path, *, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from ``path``, or one line naming the file and what is wrong: the file is refused above
    ``max_bytes`` (before it is read) and when nested too deeply for Python's parser."""
    if not path.is_file():
        raise HfError(
            f"{path}: file not found; give a directory written by save_pretrained (MarianMTModel and MarianTokenizer)"
        )
    size = path.stat().st_size
    if size > max_bytes:
        raise HfError(
            f"{path}: {size:,} bytes, more than the {max_bytes:,} such a file may hold; download or save it again"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise HfError(f"{path}: not valid JSON ({brief(exc)}); download or save it again") from None
    except RecursionError:  # json's parser recurses once per nested list or object
        raise HfError(f"{path}: JSON nested too deeply to be a model's file; download or save it again") from None
    if not isinstance(data, dict):
        raise HfError(
            f"{path}: holds a JSON {JSON_KINDS.get(type(data), 'value')}, not an object; download or save it again"
        )
    return data


def read_vocab(path: Path) -> list[str]:
    """The pieces of a ``vocab.json``, piece at index = id; ids must be 0..n-1, each once."""
    table = read_json(path, max_bytes=MAX_VOCAB_BYTES)
    pieces: list[str | None] = [None] * len(table)
    for piece, index in table.items():
        if (
            not isinstance(index, int)
            or isinstance(index, bool)
            or not 0 <= index < len(table)
            or pieces[index] is not None
        ):
            raise HfError(
                f"{path}: piece {quote(piece)} has id {quote(index)}; ids must be 0..{len(table) - 1}, each once (one "
                "embedding row per piece)"
            )
        pieces[index] = piece
    return [p for p in pieces if p is not None]


def special_pieces(tokenizer_config: dict[str, Any], *, path: Path) -> dict[str, str]:
    """unk_token, eos_token and pad_token as ``tokenizer_config.json`` (``path``) names them: a string or an
    AddedToken dict whose ``content`` is one; missing or null: MarianTokenizer's default."""
    out = {}
    for key, default in SPECIAL_PIECES.items():
        value = tokenizer_config.get(key)
        piece = value.get("content") if isinstance(value, dict) else value
        if piece is None:
            piece = default
        if not isinstance(piece, str):
            raise HfError(
                f"{path}: {key}={quote(value)} must be a piece (a string, or an object whose content is one); fix or "
                "re-save the tokenizer"
            )
        out[key] = piece
    return out


def special_id(vocab: list[str], piece: str, *, key: str, path: Path) -> int:
    try:
        return vocab.index(piece)
    except ValueError:
        raise HfError(
            f"{path}: {key} {quote(piece)} is not in the vocabulary; MarianTokenizer needs it there"
        ) from None


def vocab_json(tok: Tokenizer) -> dict[str, int]:
    """``vocab.json`` of a tmt tokenizer: its vocabulary, or its sentencepiece pieces in id order."""
    return {piece: i for i, piece in enumerate(tok.pieces())}


def tokenizer_config(src_tok: Tokenizer, tgt_tok: Tokenizer, *, separate: bool, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` for MarianTokenizer: the special pieces at tmt's special ids, and whether the
    target side has its own vocabulary. UNK and EOS must be the same piece on both sides; the pad piece is the
    source's (the target side pads and starts with config.json's pad_token_id, whatever piece that id is there)."""
    specials = src_tok.specials
    out: dict[str, Any] = {
        "tokenizer_class": "MarianTokenizer",
        "separate_vocabs": separate,
        "model_max_length": max_length,
    }
    for key, index in (("unk_token", specials.unk), ("eos_token", specials.eos), ("pad_token", specials.pad)):
        piece = src_tok.id_to_piece(index)
        if key != "pad_token" and tgt_tok.id_to_piece(index) != piece:
            raise HfError(
                f"{key}: the source piece {piece!r} and the target piece {tgt_tok.id_to_piece(index)!r} at id {index} "
                "differ; MarianTokenizer has one of each for both sides"
            )
        out[key] = piece
    out["source_lang"], out["target_lang"] = None, None
    return out
