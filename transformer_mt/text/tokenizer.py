"""Sentencepiece training, encoding and decoding, and the toolkit's fixed special ids.

The special ids are the same in every model this toolkit trains, set explicitly when the
sentencepiece model is trained (sentencepiece's own defaults disable padding):

    PAD_ID = 0   "<pad>"  fills batches; masked out of attention and the loss
    UNK_ID = 1   "<unk>"  characters outside the vocabulary
    BOS_ID = 2   "<s>"    first decoder input (teacher forcing shifts the target right by it)
    EOS_ID = 3   "</s>"   ends every target sequence and every source sequence
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

import sentencepiece as spm

from transformer_mt.errors import TmtError
from transformer_mt.text.textio import TextError, iter_file

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"


class TokenizerError(TmtError, ValueError):
    """A tokenizer problem worded for the user."""


def train_sentencepiece(
    inputs: Sequence[str | os.PathLike],
    model_prefix: str | os.PathLike,
    *,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
) -> Path:
    """Train a sentencepiece model on the lines of ``inputs``; returns the ``.model`` path.

    Several inputs (source and target) give a joint vocabulary. Lines are streamed to
    sentencepiece through an iterator, so files of any size work; when there are more
    than ``input_sentence_size`` lines, sentencepiece samples that many.
    """
    if model_type not in ("unigram", "bpe"):
        raise TokenizerError(f"model type {model_type!r} is not supported; use unigram or bpe")
    for path in inputs:
        if not Path(path).is_file():
            raise TokenizerError(f"{path}: file not found; give existing text files to train the tokenizer on")
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    reader = _ReadErrorKept(_nonempty_lines(inputs))
    lines: Iterable[str] = reader
    if sys.stderr.isatty():  # sentencepiece reads every line before it trains: show the reading
        from tqdm import tqdm

        lines = tqdm(lines, desc="reading for sentencepiece", unit=" lines", leave=False)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_prefix=str(prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            seed_sentencepiece_size=1_000_000,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece=PAD,
            unk_piece=UNK,
            bos_piece=BOS,
            eos_piece=EOS,
            # Keep whitespace-only and very long lines from aborting training.
            max_sentence_length=1 << 16,
            minloglevel=2,
            num_threads=os.cpu_count() or 1,
        )
    except RuntimeError as exc:
        if reader.error is not None:  # sentencepiece turns the reader's TextError into a RuntimeError: raise the original
            raise reader.error from None
        msg = str(exc).splitlines()[-1] if str(exc) else repr(exc)
        if "Vocabulary size is too high" in msg or "vocab_size" in msg:
            raise TokenizerError(f"sentencepiece: {msg.strip()}; lower the vocabulary size (--vocab-size / tokenizer.vocab_size)") from None
        raise TokenizerError(f"sentencepiece training failed: {msg.strip()}") from None
    return prefix.parent / f"{prefix.name}.model"  # sentencepiece appends ".model" to the prefix as given


def _nonempty_lines(paths: Iterable[str | os.PathLike]) -> Iterator[str]:
    """Stripped non-empty lines, read as training reads them (textio: invalid UTF-8 is an error naming the line)."""
    for path in paths:
        for line in iter_file(path):
            line = line.strip()
            if line:
                yield line


class _ReadErrorKept:
    """An iterator that remembers the TextError its source raised (sentencepiece re-raises it as a RuntimeError)."""

    def __init__(self, lines: Iterator[str]):
        self.lines = lines
        self.error: TextError | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self.lines)
        except TextError as exc:
            self.error = exc
            raise


class Tokenizer:
    """One sentencepiece model, with the toolkit's special ids checked on load."""

    def __init__(self, model: str | os.PathLike | bytes):
        self.proto = model if isinstance(model, bytes) else _read_model(model)
        self.sp = spm.SentencePieceProcessor(model_proto=self.proto)
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            where = model if not isinstance(model, bytes) else "sentencepiece model"
            raise TokenizerError(
                f"{where}: special ids (pad, unk, bos, eos) are {ids}, expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; "
                "train it with `tmt tokenize train` so the ids match"
            )

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Ids without BOS/EOS; the data and search code add them where they belong."""
        return self.sp.encode(lines, out_type=int)

    def encode_pieces(self, lines: list[str]) -> list[list[str]]:
        return self.sp.encode(lines, out_type=str)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Detokenized text; PAD/BOS/EOS are dropped."""
        specials = (PAD_ID, BOS_ID, EOS_ID)
        return self.sp.decode([[i for i in seq if i not in specials] for seq in ids])

    def decode_pieces(self, pieces: list[list[str]]) -> list[str]:
        return self.sp.decode(pieces)


def _read_model(path: str | os.PathLike) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"{path}: sentencepiece model not found; train one with `tmt tokenize train` or fix the path")
    data = path.read_bytes()
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError:
        raise TokenizerError(f"{path}: not a sentencepiece model; give the .model file written by `tmt tokenize train`") from None
    return data


def encode_stream(tok: Tokenizer, lines: Iterable[str], out: TextIO, *, as_ids: bool, batch: int = 1000) -> int:
    """Encode text lines to space-separated pieces or ids; one output line per input line."""
    count = 0
    buf: list[str] = []

    def flush() -> None:
        encoded = tok.encode(buf) if as_ids else tok.encode_pieces(buf)
        for seq in encoded:
            out.write(" ".join(map(str, seq)) + "\n")
        buf.clear()

    for line in lines:
        buf.append(line.rstrip("\n"))
        count += 1
        if len(buf) >= batch:
            flush()
    if buf:
        flush()
    return count


def decode_stream(tok: Tokenizer, lines: Iterable[str], out: TextIO, *, as_ids: bool, source: str = "<stdin>") -> int:
    """Inverse of :func:`encode_stream`."""
    count = 0
    for lineno, line in enumerate(lines, 1):
        fields = line.split()
        if as_ids:
            try:
                ids = [int(f) for f in fields]
            except ValueError:
                raise TokenizerError(f"{source}:{lineno}: expected space-separated integer ids; drop --ids to decode pieces") from None
            bad = [i for i in ids if not 0 <= i < tok.vocab_size]
            if bad:
                raise TokenizerError(f"{source}:{lineno}: id {bad[0]} is outside the vocabulary (size {tok.vocab_size})")
            out.write(tok.decode([ids])[0] + "\n")
        else:
            out.write(tok.decode_pieces([fields])[0] + "\n")
        count += 1
    return count
