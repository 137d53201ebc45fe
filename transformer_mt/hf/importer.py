"""``tmt import --from marian-hf DIR -o model.pt``: a MarianMT / OPUS-MT directory as a tmt checkpoint.

The steps of a converter (CTranslate2's ``Converter``: check, load, validate, save), each check before anything
its file asks for is allocated:

1. read ``config.json``, ``generation_config.json`` and the tokenizer files (each refused above a size read whole,
   :data:`~transformer_mt.hf.vocab.MAX_CONFIG_BYTES` / :data:`~transformer_mt.hf.vocab.MAX_VOCAB_BYTES`), map the
   config onto tmt's ``model`` section (:mod:`~transformer_mt.hf.marian_config`: types, and each size within
   :data:`~transformer_mt.config.LIMITS`), and run :func:`~transformer_mt.config.validate` on the whole tmt config,
   as every later command does on the checkpoint;
2. bound the model's size: :data:`~transformer_mt.config.MAX_PARAMETERS` numbers counted with the real vocabularies,
   and the sinusoid table it computes at most :data:`MAX_POSITION_TABLE_BYTES`;
3. build the model on the ``meta`` device (shapes, no storage) and compare every stored tensor's name, shape and
   dtype with it, from the safetensors headers or the memory-mapped pytorch_model.bin
   (:mod:`~transformer_mt.hf.weights`), before any tensor's numbers are read;
4. read the tensors into the model's state dict (float32) and save a self-contained checkpoint: weights, the whole
   config, both sentencepiece models and their vocabularies. Every tmt command accepts it.

Memory: at most 4 P + 3 L + 5 T + F bytes, and only what the files hold, where
P is the model's numbers in float32 (the state dict: at most MAX_PARAMETERS, 8 GiB, and allocated only once the
files were found to hold every one of those tensors, so a few-KB config cannot ask for them); L the largest
projection, whose q, k and v are read and then fused; T MarianMT's sinusoid table (max_position_embeddings x
d_model x 4 bytes, at most 1 GiB), computed in float64 only when a file stores one to compare; F the files read
whole (JSON and safetensors headers at most MAX_CONFIG_BYTES each, vocabularies and sentencepiece models at most
MAX_VOCAB_BYTES each, several times that as Python objects). A pytorch_model.bin's numbers are memory-mapped, not
copied, until they are read; its pickle (the tensors' names and shapes) is read whole, weights-only.

The special ids come from the model and its vocabulary: EOS, PAD and the decoder's start from ``config.json``
(which must agree with the pieces ``tokenizer_config.json`` names), UNK from ``vocab.json``; MarianMT has no BOS.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import Importer, pack_tokenizers, save_checkpoint
from transformer_mt.config import (
    LIMITS,
    MAX_POSITION_TABLE_BYTES,
    Config,
    DataConfig,
    DecodeConfig,
    TokenizerConfig,
    beam_problem,
    model_elements,
    quote,
    size_problem,
    to_dict,
    validate,
)
from transformer_mt.hf.errors import HfError, brief
from transformer_mt.hf.marian_config import MarianShape, model_config_from_marian
from transformer_mt.hf.vocab import (
    MAX_VOCAB_BYTES,
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    TOKENIZER_CONFIG,
    VOCAB,
    read_json,
    read_vocab,
    special_id,
    special_pieces,
)
from transformer_mt.hf.weights import check_stored, marian_layout, open_weights, tmt_state
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


class MarianImporter(Importer):
    """`tmt import --from marian-hf`: :func:`import_marian`."""

    def convert(self, directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
        return import_marian(directory, output, force=force)


def import_marian(directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """Write the MarianMT model in ``directory`` as the tmt checkpoint ``output``; returns its path.
    An existing ``output`` is replaced only with ``force`` (never a directory)."""
    src_dir, out = Path(directory), Path(output)
    if not src_dir.is_dir():
        raise HfError(
            f"{src_dir}: not a directory; give the folder save_pretrained wrote (config.json, model.safetensors, "
            "vocab.json, *.spm)"
        )
    if out.is_dir():
        raise HfError(f"{out}: is a directory; give the checkpoint file to write, e.g. -o {out / 'model.pt'}")
    if out.exists() and not force:
        raise HfError(f"{out}: already exists; choose another -o file or pass --force to replace it")
    files = read_marian_dir(src_dir)
    cfg = imported_config(files)
    config_json = src_dir / "config.json"
    _check_size(files.shape, source=config_json)
    validate(cfg, source=str(config_json), check_files=False)  # what every later command checks in the checkpoint
    with torch.device("meta"):  # shapes and dtypes, no storage
        skeleton = Transformer(
            cfg.model, src_vocab_size=files.shape.src_vocab_size, tgt_vocab_size=files.shape.tgt_vocab_size
        )
    stored, weight_file = open_weights(src_dir)
    layout = marian_layout(skeleton, stored)
    check_stored(stored, layout, source=weight_file)
    state = tmt_state(stored, layout, skeleton)  # the numbers, read only now
    tokenizers = pack_tokenizers(files.src_proto, files.tgt_proto, src_vocab=files.src_vocab, tgt_vocab=files.tgt_vocab)
    out.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint({"model": state, "config": to_dict(cfg), "tokenizers": tokenizers}, out)


def _check_size(shape: MarianShape, *, source: Path) -> None:
    """The model's numbers within :data:`~transformer_mt.config.MAX_PARAMETERS`, counted with the real vocabularies,
    and its sinusoid table within :data:`MAX_POSITION_TABLE_BYTES`."""
    model = shape.model
    problem = size_problem(
        model_elements(model, src_vocab_size=shape.src_vocab_size, tgt_vocab_size=shape.tgt_vocab_size)
    )
    if problem:
        raise HfError(f"{source}: d_model, encoder_layers, decoder_layers, the ffn dims and vocab_size make {problem}")
    table = model.max_positions * model.d_model * 4
    if table > MAX_POSITION_TABLE_BYTES:
        raise HfError(
            f"{source}: max_position_embeddings={model.max_positions} x d_model={model.d_model} make a sinusoid table "
            f"of {table / 2**30:.1f} GiB, more than {MAX_POSITION_TABLE_BYTES >> 30} GiB; MarianMT models use 512 "
            "positions"
        )


def read_marian_dir(directory: Path) -> MarianFiles:
    """Read and cross-check config.json, tokenizer_config.json, the vocabularies and the sentencepiece models."""
    config = read_json(directory / "config.json")
    tok_path = directory / TOKENIZER_CONFIG
    tok_config = read_json(tok_path) if tok_path.is_file() else {}
    separate = tok_config.get("separate_vocabs")
    if separate is None:
        separate = False
    if not isinstance(separate, bool):
        raise HfError(
            f"{tok_path}: separate_vocabs={quote(separate)} must be true or false; fix or re-save the tokenizer"
        )
    if separate and not (directory / TARGET_VOCAB).is_file():
        raise HfError(
            f"{tok_path}: separate_vocabs=true but {TARGET_VOCAB} is missing; download it, or re-save the tokenizer"
        )
    src_vocab = read_vocab(directory / VOCAB)
    tgt_vocab = read_vocab(directory / TARGET_VOCAB) if separate else src_vocab
    pieces = special_pieces(tok_config, path=tok_path)
    ids = {}
    for key, piece in pieces.items():  # MarianTokenizer looks its special pieces up in each side's vocabulary
        ids[key] = special_id(src_vocab, piece, key=key, path=directory / VOCAB)
        # The target side pads and starts with config.json's pad_token_id whatever target_vocab.json's <pad> is
        # (MarianMT appends <pad> to each vocabulary, so with separate vocabularies of two sizes the ids differ); EOS
        # and UNK must agree.
        if (
            separate
            and key != "pad_token"
            and special_id(tgt_vocab, piece, key=key, path=directory / TARGET_VOCAB) != ids[key]
        ):
            raise HfError(
                f"{directory / TARGET_VOCAB}: {key} {quote(piece)} has another id than in {VOCAB}; tmt has one id per "
                "special piece"
            )
    shape = model_config_from_marian(config, unk_id=ids["unk_token"], source=str(directory / "config.json"))
    if shape.model.share_all_embeddings and separate:
        raise HfError(
            f"{tok_path}: separate_vocabs=true but config.json share_encoder_decoder_embeddings=true; "
            "a model with one embedding matrix has one vocabulary (fix either file)"
        )
    for key, field, value in (
        ("eos_token", "eos_token_id", shape.model.eos_id),
        ("pad_token", "pad_token_id", shape.model.pad_id),
    ):
        if ids[key] != value:
            raise HfError(
                f"{directory / 'config.json'}: {field}={value} but the tokenizer's {key} {quote(pieces[key])} has id "
                f"{ids[key]}; the model and its tokenizer must agree"
            )
    for path, vocab, field, size in (
        (directory / VOCAB, src_vocab, "vocab_size", shape.src_vocab_size),
        (directory / (TARGET_VOCAB if separate else VOCAB), tgt_vocab, "decoder_vocab_size", shape.tgt_vocab_size),
    ):
        if len(vocab) != size:
            raise HfError(
                f"{path}: lists {len(vocab)} pieces but config.json {field}={size}; tmt needs one piece per embedding "
                "row"
            )
    beam = _num_beams(directory / GENERATION_CONFIG, tgt_vocab_size=shape.tgt_vocab_size)
    files = MarianFiles(
        config,
        shape,
        src_vocab,
        tgt_vocab,
        _spm(directory / SOURCE_SPM),
        _spm(directory / TARGET_SPM),
        separate,
        beam,
    )
    specials = SpecialIds.of(shape.model)
    for proto, vocab, name in ((files.src_proto, src_vocab, SOURCE_SPM), (files.tgt_proto, tgt_vocab, TARGET_SPM)):
        try:
            Tokenizer(proto, vocab=vocab, specials=specials)
        except (TokenizerError, RuntimeError) as exc:  # sentencepiece raises RuntimeError for a proto it cannot parse
            raise HfError(
                f"{directory / name}: not a usable sentencepiece model ({brief(exc)}); download it again"
            ) from None
    return files


def _num_beams(path: Path, *, tgt_vocab_size: int) -> int:
    """generation_config.json's num_beams (tmt's decode.beam), 4 without the file or the field; a value the search
    refuses (decode.beam's limit, or more than the target vocabulary allows) is refused here, naming it."""
    beam = read_json(path).get("num_beams") if path.is_file() else None
    if beam is None:
        return 4
    if not isinstance(beam, int) or isinstance(beam, bool):
        raise HfError(f"{path}: num_beams={quote(beam)} must be an integer; fix or delete generation_config.json")
    problem = beam_problem(beam, tgt_vocab_size=tgt_vocab_size, limit=LIMITS["decode.beam"])
    if problem:
        raise HfError(f"{path}: num_beams={quote(beam)} {problem.reason}")
    return beam


def _spm(path: Path) -> bytes:
    if not path.is_file():
        raise HfError(
            f"{path}: sentencepiece model not found; MarianTokenizer's {path.name} belongs beside config.json"
        )
    size = path.stat().st_size
    if size > MAX_VOCAB_BYTES:
        raise HfError(
            f"{path}: {size:,} bytes, more than the {MAX_VOCAB_BYTES:,} a sentencepiece model may hold; download it "
            "again"
        )
    return path.read_bytes()


def imported_config(files: MarianFiles) -> Config:
    """The whole tmt Config of an imported model: its model section; tokenizer, data and decode sections that fit it
    (fine-tuning sets the data files, and may change train and decode)."""
    model = files.shape.model
    return Config(
        data=DataConfig(max_len=max(1, min(DataConfig().max_len, model.max_positions - 2))),
        tokenizer=TokenizerConfig(joint=not files.separate, vocab_size=len(files.src_vocab)),
        model=model,
        decode=DecodeConfig(beam=files.beam),
    )
