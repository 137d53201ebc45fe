"""Sentencepiece training, encoding and decoding.

The models tmt trains have the same special ids, set explicitly when the sentencepiece model is
trained (sentencepiece's own defaults disable padding):

    PAD_ID = 0   "<pad>"  fills batches; masked out of attention and the loss
    UNK_ID = 1   "<unk>"  characters outside the vocabulary
    BOS_ID = 2   "<s>"    first decoder input (teacher forcing shifts the target right by it)
    EOS_ID = 3   "</s>"   ends every target sequence and every source sequence

An imported model brings its own ids and a vocabulary file (:class:`Tokenizer` with ``vocab``);
:mod:`~transformer_mt.text.specials` holds the ids each model uses.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import sentencepiece as spm

from transformer_mt.errors import TmtError
from transformer_mt.text.specials import BOS_ID, DEFAULT, EOS_ID, PAD_ID, UNK_ID, SpecialIds
from transformer_mt.text.textio import TextError, iter_file

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
        if (
            reader.error is not None
        ):  # sentencepiece turns the reader's TextError into a RuntimeError: raise the original
            raise reader.error from None
        msg = str(exc).splitlines()[-1] if str(exc) else repr(exc)
        if "Vocabulary size is too high" in msg or "vocab_size" in msg:
            raise TokenizerError(
                f"sentencepiece: {msg.strip()}; lower the vocabulary size (--vocab-size / tokenizer.vocab_size)"
            ) from None
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
    """One sentencepiece model, and the ids of its pieces.

    Without ``vocab`` the ids are sentencepiece's own, and its special ids must be ``specials``' (tmt trains
    its models with :data:`~transformer_mt.text.specials.DEFAULT`). With ``vocab`` (the piece of each id, as
    MarianMT's vocab.json lists them) sentencepiece only segments: each piece's id is its index in ``vocab``,
    a piece not in it gets ``specials.unk``, and a leading language tag such as ``>>fra<<`` is one piece, as
    ``transformers.MarianTokenizer`` encodes it.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes,
        *,
        vocab: Sequence[str] | None = None,
        specials: SpecialIds | None = None,
    ):
        self.proto = model if isinstance(model, bytes) else _read_model(model)
        self.sp = spm.SentencePieceProcessor(model_proto=self.proto)
        self.specials = specials or DEFAULT
        self.vocab = None if vocab is None else list(vocab)
        where = model if not isinstance(model, bytes) else "sentencepiece model"
        if self.vocab is None:
            ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
            want = (self.specials.pad, self.specials.unk, self.specials.bos, self.specials.eos)
            if ids != want:
                raise TokenizerError(
                    f"{where}: special ids (pad, unk, bos, eos) are {ids}, expected {want}; "
                    "train it with `tmt tokenize train` so the ids match"
                )
            self._index: dict[str, int] = {}
        else:
            self._index = {piece: i for i, piece in enumerate(self.vocab)}
            if len(self._index) != len(self.vocab):
                raise TokenizerError(
                    f"{where}: its vocabulary lists a piece twice; give a vocabulary with one id per piece"
                )
            bad = [i for i in self.specials.kept_ids if i >= len(self.vocab)]
            if bad:
                raise TokenizerError(
                    f"{where}: special id {bad[0]} is outside its vocabulary of {len(self.vocab)} pieces; "
                    "check the model.*_id keys"
                )

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size() if self.vocab is None else len(self.vocab)

    @property
    def fingerprint(self) -> str:
        """sha256 of what decides the ids: the sentencepiece model, and the vocabulary when there is one."""
        digest = hashlib.sha256(self.proto)
        if self.vocab is not None:
            digest.update(b"\0vocab\0" + "\n".join(self.vocab).encode("utf-8"))
        return digest.hexdigest()

    def __eq__(self, other: object) -> bool:
        """Two tokenizers are equal when they give every text the same ids."""
        return isinstance(other, Tokenizer) and (self.proto, self.vocab, self.specials) == (
            other.proto,
            other.vocab,
            other.specials,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable fields: equal tokenizers need not hash alike

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(i) if self.vocab is None else self.vocab[i]

    def pieces(self) -> list[str]:
        """The piece of every id, in id order."""
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)] if self.vocab is None else list(self.vocab)

    def encode(self, lines: list[str], *, alpha: float = 0.0, nbest: int = -1) -> list[list[int]]:
        """Ids without BOS/EOS; the data and search code add them where they belong. ``alpha`` > 0 samples a
        segmentation (subword regularisation: unigram smoothing, or the BPE-dropout rate) among ``nbest``."""
        sample: dict[str, Any] = (
            {"enable_sampling": True, "alpha": alpha, "nbest_size": nbest, "num_threads": 1} if alpha > 0 else {}
        )
        if self.vocab is None:
            return _each_or_all(self.sp.encode, lines, out_type=int, **sample)
        unk, index = self.specials.unk, self._index
        return [[index.get(piece, unk) for piece in seq] for seq in self.encode_pieces(lines, **sample)]

    def encode_pieces(self, lines: list[str], **sample: Any) -> list[list[str]]:
        if self.vocab is None:
            return _each_or_all(self.sp.encode, lines, out_type=str, **sample)
        tags, texts = zip(*map(_split_language_tag, lines)) if lines else ((), ())
        return [
            tag + pieces for tag, pieces in zip(tags, _each_or_all(self.sp.encode, list(texts), out_type=str, **sample))
        ]

    def decode(self, ids: list[list[int]], **threads: Any) -> list[str]:
        """Detokenized text; padding, BOS, EOS and the decoder's start are dropped."""
        drop = self.specials.not_text
        if self.vocab is None:
            return _each_or_all(self.sp.decode, [[i for i in seq if i not in drop] for seq in ids], **threads)
        return self.decode_pieces([[self.vocab[i] for i in seq if i not in drop] for seq in ids], **threads)

    def decode_pieces(self, pieces: list[list[str]], **threads: Any) -> list[str]:
        """Text of piece lists; ``threads``: sentencepiece's ``num_threads`` for a long list."""
        return _each_or_all(self.sp.decode_pieces, pieces, **threads)


# sentencepiece's calls on a list start a pool of threads each time (tens of microseconds, more while other threads
# hold the cores: a one-line request would pay more for it than for its segmentation); up to this many lines go
# through its one-line calls, which start none.
FEW_LINES = 8


def _each_or_all(call: Any, items: list, **options: Any) -> list:
    """sentencepiece's ``call`` (encode, decode, decode_pieces) on every item of ``items``: one call per item for up to
    FEW_LINES items, else one call on the list."""
    return [call(item, **options) for item in items] if len(items) <= FEW_LINES else call(items, **options)


def _split_language_tag(line: str) -> tuple[list[str], str]:
    """MarianTokenizer's language tag: a line opening with a target-language token such as >>fra<< (up to the first
    "<<") has it as one piece, and sentencepiece segments the rest (tokenization_marian.remove_language_code)."""
    end = line.find("<<") if line.startswith(">>") else -1
    return ([line[: end + 2]], line[end + 2 :]) if end != -1 else ([], line)


def _read_model(path: str | os.PathLike) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise TokenizerError(
            f"{path}: sentencepiece model not found; train one with `tmt tokenize train` or fix the path"
        )
    data = path.read_bytes()
    try:
        spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError:
        raise TokenizerError(
            f"{path}: not a sentencepiece model; give the .model file written by `tmt tokenize train`"
        ) from None
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
                raise TokenizerError(
                    f"{source}:{lineno}: expected space-separated integer ids; drop --ids to decode pieces"
                ) from None
            bad = [i for i in ids if not 0 <= i < tok.vocab_size]
            if bad:
                raise TokenizerError(
                    f"{source}:{lineno}: id {bad[0]} is outside the vocabulary (size {tok.vocab_size})"
                )
            out.write(tok.decode([ids])[0] + "\n")
        else:
            out.write(tok.decode_pieces([fields])[0] + "\n")
        count += 1
    return count
