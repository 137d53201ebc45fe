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

import functools
import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import sentencepiece as spm

from transformer_mt.errors import TmtError
from transformer_mt.text.languages import TAG
from transformer_mt.text.specials import BOS_ID, DEFAULT, EOS_ID, PAD_ID, UNK_ID, SpecialIds
from transformer_mt.text.spm_input import ReadErrorKept, sentencepiece_lines

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
    user_defined_symbols: Sequence[str] = (),
    languages: Sequence[str] = (),
) -> Path:
    """Train a sentencepiece model on the lines of ``inputs``; returns the ``.model`` path.

    Several inputs (source and target) give a joint vocabulary. Lines are streamed to
    sentencepiece through an iterator, so files of any size work; when there are more
    than ``input_sentence_size`` lines, sentencepiece samples that many.
    ``user_defined_symbols`` (the tags ``<2fr>``, ``<BT>``) are pieces of their own, never split, and decoded back
    to their text. ``languages`` (one code per input, "" where not stated) that name more than two languages
    sample each language's lines with a temperature so that a small language keeps its pieces
    (:mod:`~transformer_mt.text.spm_input` states the rule, T = 5); one or two languages read every line once.
    """
    if model_type not in ("unigram", "bpe"):
        raise TokenizerError(f"model type {model_type!r} is not supported; use unigram or bpe")
    for path in inputs:
        if not Path(path).is_file():
            raise TokenizerError(f"{path}: file not found; give existing text files to train the tokenizer on")
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    reader = ReadErrorKept(sentencepiece_lines(inputs, languages, input_sentence_size=input_sentence_size))
    lines: Iterable[str] = reader
    if sys.stderr.isatty():  # sentencepiece reads every line before it trains: show the reading
        from tqdm import tqdm

        lines = tqdm(lines, desc="reading for sentencepiece", unit=" lines", leave=False)
    # passed only with tags: without them the options, and so the model's bytes, stay what they always were
    tagged: dict[str, Any] = {"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}
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
            **tagged,
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


class Tokenizer:
    """One sentencepiece model, and the ids of its pieces.

    Without ``vocab`` the ids are sentencepiece's own, and its special ids must be ``specials``' (tmt trains
    its models with :data:`~transformer_mt.text.specials.DEFAULT`). With ``vocab`` (the piece of each id, as
    MarianMT's vocab.json lists them) sentencepiece only segments: each piece's id is its index in ``vocab``,
    a piece not in it gets ``specials.unk``, and a leading language tag such as ``>>fra<<`` is one piece, as
    ``transformers.MarianTokenizer`` encodes it.

    A tag that is a user-defined symbol of the model (``<2fr>``, ``<BT>``: :mod:`~transformer_mt.text.languages`)
    is one piece wherever it stands, and decodes back to its text. At the start of a line it is encoded as the
    tag's id followed by the rest of the line's (``"<2fr> A man."`` -> ``[id(<2fr>)] + encode("A man.")``), the ids
    the training data and the Translator prefix sources with; sentencepiece alone would put a lone "▁" first.
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
            split = self._leading_tags(lines)
            if split is None:
                return _each_or_all(self.sp.encode, lines, out_type=int, **sample)
            tags, texts = split
            ids = _each_or_all(self.sp.encode, texts, out_type=int, **sample)
            return [[self.sp.piece_to_id(t) for t in tag] + seq for tag, seq in zip(tags, ids)]
        unk, index = self.specials.unk, self._index
        return [[index.get(piece, unk) for piece in seq] for seq in self.encode_pieces(lines, **sample)]

    def encode_pieces(self, lines: list[str], **sample: Any) -> list[list[str]]:
        if self.vocab is None:
            split = self._leading_tags(lines)
            if split is None:
                return _each_or_all(self.sp.encode, lines, out_type=str, **sample)
            leading, rest = split
            return [
                tag + pieces for tag, pieces in zip(leading, _each_or_all(self.sp.encode, rest, out_type=str, **sample))
            ]
        tags, texts = zip(*map(_split_language_tag, lines)) if lines else ((), ())
        return [
            tag + pieces for tag, pieces in zip(tags, _each_or_all(self.sp.encode, list(texts), out_type=str, **sample))
        ]

    @functools.cached_property
    def user_defined_symbols(self) -> frozenset[str]:
        """The model's user-defined symbols (its tags): pieces sentencepiece never splits; none for a tokenizer whose
        ids come from a vocabulary (its language tag is MarianMT's ``>>fra<<``)."""
        return frozenset() if self.vocab is not None else user_defined_pieces(self.proto)

    def tag_ids(self, tags: Sequence[str], *, where: str) -> list[int]:
        """The id of each tag (``<2fr>``, ``<BT>``), a user-defined symbol of the model (with a vocabulary: a piece of
        it), so that text starting with it encodes as its id. A tag the tokenizer would split is a TokenizerError
        naming ``where``, the tag and the fix."""
        ids = []
        for tag in tags:
            i = self._index.get(tag) if self.vocab is not None else self.sp.piece_to_id(tag)
            if i is None or (self.vocab is None and tag not in self.user_defined_symbols):
                raise TokenizerError(
                    f"{where}: the tokenizer has no piece {tag} and would split it; retrain the tokenizer with the "
                    f"run's tags (leave tokenizer.model empty), or add {tag} to it as a user-defined symbol"
                )
            ids.append(i)
        return ids

    def _leading_tags(self, lines: list[str]) -> tuple[list[list[str]], list[str]] | None:
        """Each line's leading tags (user-defined symbols) and the text after them; None when no line starts with
        one (the common case, decided without reading the model's symbols unless a line starts with "<")."""
        if not any(line.lstrip().startswith("<") for line in lines) or not self.user_defined_symbols:
            return None
        split = [_split_tags(line, self.user_defined_symbols) for line in lines]
        if not any(tags for tags, _ in split):
            return None
        return [tags for tags, _ in split], [text for _, text in split]

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


def _split_tags(line: str, symbols: frozenset[str]) -> tuple[list[str], str]:
    """The user-defined tags a line starts with (spaces around them ignored, as sentencepiece ignores them) and the
    rest of the line; no tags: ([], line)."""
    tags, rest = [], line.lstrip()
    while (match := TAG.match(rest)) and match.group() in symbols:
        tags.append(match.group())
        rest = rest[match.end() :].lstrip()
    return (tags, rest) if tags else ([], line)


USER_DEFINED = 4  # sentencepiece_model.proto: SentencePiece.Type.USER_DEFINED


def user_defined_pieces(proto: bytes) -> frozenset[str]:
    """The pieces of type USER_DEFINED in a serialized sentencepiece ModelProto: its field 1 holds the pieces, each a
    SentencePiece message of piece (1, string), score (2, float) and type (3, enum). Read here because sentencepiece's
    Python API does not say which pieces are user-defined, and its protobuf classes need the protobuf package."""
    if bytes([3 << 3, USER_DEFINED]) not in proto:  # the type field with that value: no piece can be one without it
        return frozenset()
    found = set()
    for field, value in _proto_fields(proto):
        if field == 1 and isinstance(value, bytes):
            piece, kind = "", 1
            for sub, sub_value in _proto_fields(value):
                if sub == 1 and isinstance(sub_value, bytes):
                    piece = sub_value.decode("utf-8", errors="replace")
                elif sub == 3 and isinstance(sub_value, int):
                    kind = sub_value
            if kind == USER_DEFINED:
                found.add(piece)
    return frozenset(found)


def _proto_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: an int for a varint, bytes for a length-delimited field; fixed
    32- and 64-bit values are skipped. The model was parsed by sentencepiece already, so it is well formed."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield field, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield field, data[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:  # groups (3, 4) are not in sentencepiece's schema
            return


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


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
