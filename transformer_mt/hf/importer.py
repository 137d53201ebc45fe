"""``tmt import --from marian-hf DIR -o model.pt``: a MarianMT / OPUS-MT directory as a tmt checkpoint.

The steps of a converter (CTranslate2's ``Converter``: check, load, validate, save): read and check
``config.json`` and the tokenizer files, map the config onto tmt's ``model`` section
(:mod:`~transformer_mt.hf.marian_config`), rename the weights (:mod:`~transformer_mt.hf.weights`), load them into
a tmt ``Transformer`` built from that config (which checks every shape), and save a self-contained checkpoint:
weights, the whole config, both sentencepiece models and their vocabularies. Every tmt command accepts it.

The special ids come from the model and its vocabulary: EOS, PAD and the decoder's start from ``config.json``
(which must agree with the pieces ``tokenizer_config.json`` names), UNK from ``vocab.json``; MarianMT has no BOS.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import pack_tokenizers, save_checkpoint
from transformer_mt.config import Config, DataConfig, DecodeConfig, TokenizerConfig, to_dict
from transformer_mt.hf import HfError
from transformer_mt.hf.marian_config import MarianShape, model_config_from_marian
from transformer_mt.hf.vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, TOKENIZER_CONFIG, VOCAB, read_json, read_vocab, special_id, special_pieces
from transformer_mt.hf.weights import read_weights, tmt_state
from transformer_mt.model import Transformer
from transformer_mt.text import SpecialIds, Tokenizer, TokenizerError

GENERATION_CONFIG = "generation_config.json"


@dataclasses.dataclass(frozen=True)
class MarianFiles:
    """What a MarianMT directory holds, read and checked."""

    config: dict[str, Any]  # config.json
    shape: MarianShape  # the tmt model section and vocabulary sizes it maps to
    src_vocab: list[str]  # vocab.json, piece at index = id
    tgt_vocab: list[str]  # target_vocab.json with separate_vocabs, else vocab.json
    src_proto: bytes  # source.spm
    tgt_proto: bytes  # target.spm
    separate: bool  # tokenizer_config.json separate_vocabs
    beam: int  # generation_config.json num_beams (tmt's decode.beam), 4 without one


def import_marian(directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """Write the MarianMT model in ``directory`` as the tmt checkpoint ``output``; returns its path.
    An existing ``output`` is replaced only with ``force`` (never a directory)."""
    src_dir, out = Path(directory), Path(output)
    if not src_dir.is_dir():
        raise HfError(f"{src_dir}: not a directory; give the folder save_pretrained wrote (config.json, model.safetensors, vocab.json, *.spm)")
    if out.is_dir():
        raise HfError(f"{out}: is a directory; give the checkpoint file to write, e.g. -o {out / 'model.pt'}")
    if out.exists() and not force:
        raise HfError(f"{out}: already exists; choose another -o file or pass --force to replace it")
    files = read_marian_dir(src_dir)
    model = Transformer(files.shape.model, src_vocab_size=files.shape.src_vocab_size, tgt_vocab_size=files.shape.tgt_vocab_size)
    weights, weight_file = read_weights(src_dir)
    model.load_state_dict(tmt_state(weights, model, source=weight_file))
    cfg = imported_config(files)
    tokenizers = pack_tokenizers(files.src_proto, files.tgt_proto, src_vocab=files.src_vocab, tgt_vocab=files.tgt_vocab)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint({"model": model.state_dict(), "config": to_dict(cfg), "tokenizers": tokenizers}, out)


def read_marian_dir(directory: Path) -> MarianFiles:
    """Read and cross-check config.json, tokenizer_config.json, the vocabularies and the sentencepiece models."""
    config = read_json(directory / "config.json")
    tok_path = directory / TOKENIZER_CONFIG
    tok_config = read_json(tok_path) if tok_path.is_file() else {}
    separate = bool(tok_config.get("separate_vocabs", False))
    src_vocab = read_vocab(directory / VOCAB)
    tgt_vocab = read_vocab(directory / TARGET_VOCAB) if separate else src_vocab
    pieces = special_pieces(tok_config)
    ids = {}
    for key, piece in pieces.items():  # MarianTokenizer looks its special pieces up in each side's vocabulary
        ids[key] = special_id(src_vocab, piece, key=key, path=directory / VOCAB)
        # The target side pads and starts with config.json's pad_token_id whatever target_vocab.json's <pad> is (MarianMT
        # appends <pad> to each vocabulary, so with separate vocabularies of two sizes the ids differ); EOS and UNK must agree.
        if separate and key != "pad_token" and special_id(tgt_vocab, piece, key=key, path=directory / TARGET_VOCAB) != ids[key]:
            raise HfError(f"{directory / TARGET_VOCAB}: {key} {piece!r} has another id than in {VOCAB}; tmt has one id per special piece")
    shape = model_config_from_marian(config, unk_id=ids["unk_token"], source=str(directory / "config.json"))
    for key, field, value in (("eos_token", "eos_token_id", shape.model.eos_id), ("pad_token", "pad_token_id", shape.model.pad_id)):
        if ids[key] != value:
            raise HfError(
                f"{directory / 'config.json'}: {field}={value} but the tokenizer's {key} {pieces[key]!r} has id {ids[key]}; "
                "the model and its tokenizer must agree"
            )
    for path, vocab, field, size in (
        (directory / VOCAB, src_vocab, "vocab_size", shape.src_vocab_size),
        (directory / (TARGET_VOCAB if separate else VOCAB), tgt_vocab, "decoder_vocab_size", shape.tgt_vocab_size),
    ):
        if len(vocab) != size:
            raise HfError(f"{path}: lists {len(vocab)} pieces but config.json {field}={size}; tmt needs one piece per embedding row")
    gen_path = directory / GENERATION_CONFIG
    beam = read_json(gen_path).get("num_beams", 4) if gen_path.is_file() else 4
    files = MarianFiles(
        config,
        shape,
        src_vocab,
        tgt_vocab,
        _spm(directory / SOURCE_SPM),
        _spm(directory / TARGET_SPM),
        separate,
        beam if isinstance(beam, int) and not isinstance(beam, bool) and beam >= 1 else 4,
    )
    specials = SpecialIds.of(shape.model)
    for proto, vocab, name in ((files.src_proto, src_vocab, SOURCE_SPM), (files.tgt_proto, tgt_vocab, TARGET_SPM)):
        try:
            Tokenizer(proto, vocab=vocab, specials=specials)
        except (TokenizerError, RuntimeError) as exc:  # sentencepiece raises RuntimeError for a proto it cannot parse
            raise HfError(f"{directory / name}: not a usable sentencepiece model ({str(exc).splitlines()[0][:200]}); download it again") from None
    return files


def _spm(path: Path) -> bytes:
    if not path.is_file():
        raise HfError(f"{path}: sentencepiece model not found; MarianTokenizer's {path.name} belongs beside config.json")
    return path.read_bytes()


def imported_config(files: MarianFiles) -> Config:
    """The whole tmt Config of an imported model: its model section; tokenizer, data and decode sections that fit it
    (fine-tuning sets the data files, and may change train and decode)."""
    model = files.shape.model
    return Config(
        data=DataConfig(max_len=min(DataConfig().max_len, model.max_positions - 2)),
        tokenizer=TokenizerConfig(joint=not files.separate, vocab_size=len(files.src_vocab)),
        model=model,
        decode=DecodeConfig(beam=files.beam),
    )
