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

from transformer_mt.hf import HfError
from transformer_mt.text import Tokenizer

VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG = "vocab.json", "target_vocab.json", "tokenizer_config.json"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
# MarianTokenizer's default special pieces (tokenizer_config.json may name others)
SPECIAL_PIECES = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or one line naming the file and what is wrong."""
    if not path.is_file():
        raise HfError(f"{path}: file not found; give a directory written by save_pretrained (MarianMTModel and MarianTokenizer)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise HfError(f"{path}: not valid JSON ({exc}); download or save it again") from None
    if not isinstance(data, dict):
        raise HfError(f"{path}: holds a JSON {type(data).__name__}, not an object; download or save it again")
    return data


def read_vocab(path: Path) -> list[str]:
    """The pieces of a ``vocab.json``, piece at index = id; ids must be 0..n-1, each once."""
    table = read_json(path)
    pieces: list[str | None] = [None] * len(table)
    for piece, index in table.items():
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(table) or pieces[index] is not None:
            raise HfError(f"{path}: piece {piece!r} has id {index!r}; ids must be 0..{len(table) - 1}, each once (one embedding row per piece)")
        pieces[index] = piece
    return [p for p in pieces if p is not None]


def special_pieces(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """unk_token, eos_token and pad_token as ``tokenizer_config.json`` names them (a string or an AddedToken dict)."""
    out = {}
    for key, default in SPECIAL_PIECES.items():
        value = tokenizer_config.get(key, default)
        out[key] = value.get("content", default) if isinstance(value, dict) else str(value)
    return out


def special_id(vocab: list[str], piece: str, *, key: str, path: Path) -> int:
    try:
        return vocab.index(piece)
    except ValueError:
        raise HfError(f"{path}: {key} {piece!r} is not in the vocabulary; MarianTokenizer needs it there") from None


def vocab_json(tok: Tokenizer) -> dict[str, int]:
    """``vocab.json`` of a tmt tokenizer: its vocabulary, or its sentencepiece pieces in id order."""
    return {piece: i for i, piece in enumerate(tok.pieces())}


def tokenizer_config(src_tok: Tokenizer, tgt_tok: Tokenizer, *, separate: bool, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` for MarianTokenizer: the special pieces at tmt's special ids, and whether the
    target side has its own vocabulary. UNK and EOS must be the same piece on both sides; the pad piece is the
    source's (the target side pads and starts with config.json's pad_token_id, whatever piece that id is there)."""
    specials = src_tok.specials
    out: dict[str, Any] = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": separate, "model_max_length": max_length}
    for key, index in (("unk_token", specials.unk), ("eos_token", specials.eos), ("pad_token", specials.pad)):
        piece = src_tok.id_to_piece(index)
        if key != "pad_token" and tgt_tok.id_to_piece(index) != piece:
            raise HfError(
                f"{key}: the source piece {piece!r} and the target piece {tgt_tok.id_to_piece(index)!r} at id {index} differ; "
                "MarianTokenizer has one of each for both sides"
            )
        out[key] = piece
    out["source_lang"], out["target_lang"] = None, None
    return out
