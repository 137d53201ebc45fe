"""Parallel corpora: aligned reading, validation and filtering, and :class:`ParallelData`, an encoded corpus
memory-mapped from its cache (the cache format is :mod:`transformer_mt.data.encoded`; batches are
:mod:`transformer_mt.data.batching`).

Reading. Lines are read by :mod:`transformer_mt.text.textio`'s rules, the same as every other reader
(strict UTF-8, split at b"\\n" only, a last line without one counts, BOM removed); each line is
stripped of surrounding whitespace. Pairs with an empty side are dropped
and counted, for training and validation alike. With ``filter_long`` (training) pairs with more
than ``max_len`` pieces on a side, or whose longer side has at least ``min_len_for_ratio``
pieces and more than ``max_len_ratio`` times the pieces of the shorter, are dropped too; each
dropped pair is counted under the first of empty, too long, ratio that applies. Validation sets
are loaded with ``filter_long=False``: nothing but empty pairs is dropped, and the summary
counts the kept pairs the filters would have removed (``long_kept``).

A corpus of several (``data.corpora``) may have its sources start with tags (``<2fr>``, ``<BT>``): their ids are
stored at the head of every source (``src_prefix``), count towards ``max_len`` (they take positions) but not
towards the emptiness and length-ratio tests (they are not text). An NLLB model's targets start with their language's
code (``tgt_prefix``), stored and counted the same way. A :class:`PairFilter` (``data.filters``) drops
raw pairs before they are encoded, counted as ``dropped_filtered``.

A corpus is encoded once, :data:`CHUNK_LINES` lines at a time, and loaded from its cache after that.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from transformer_mt.config import DataConfig
from transformer_mt.data.batching import Batch, Ids, collate_pairs, make_batches
from transformer_mt.data.encoded import (
    CacheWriter,
    cache_directory,
    cache_key,
    map_arrays,
    publish,
    read_meta,
    temporary_directory,
    token_dtype,
    write_meta,
)
from transformer_mt.data.summary import CorpusSummary
from transformer_mt.errors import TmtError
from transformer_mt.text import DEFAULT, SpecialIds, Tokenizer, count_lines, iter_file

CHUNK_LINES = 10_000  # lines encoded at a time: bounds memory whatever the corpus size


class DataError(TmtError, ValueError):
    """A corpus problem worded for the user: one line naming the file, the line and the fix."""


class PairFilter(Protocol):
    """Cleaning rules over raw text pairs (``data.filters``), applied chunk by chunk in file order while a corpus is
    encoded; it may keep state across chunks (duplicates)."""

    def key(self) -> dict:
        """What decides which pairs it drops (the rules and the languages), for the corpus's cache key."""
        ...

    def check(self, srcs: list[str], tgts: list[str]) -> Sequence[str]:
        """For each pair of a chunk (stripped, non-empty sides): "keep", or the name of the rule that drops it."""
        ...


# --------------------------------------------------------------------------- the encoded corpus, loaded


class ParallelData:
    """An encoded parallel corpus, memory-mapped from its cache directory.

    ``src_lengths`` / ``tgt_lengths`` (N,) int32 are piece counts without EOS / BOS;
    ``line_numbers`` (N,) int64 are 0-based lines of the text files the pairs came from; ``src_prefix`` the tag
    ids every source starts with (stored in the cache, part of ``src_lengths``), ``tgt_prefix`` those every target
    starts with (an NLLB model's target language code; part of ``tgt_lengths``).
    """

    def __init__(
        self,
        directory: Path,
        meta: dict,
        src_path: Path,
        tgt_path: Path,
        *,
        from_cache: bool,
        specials: SpecialIds = DEFAULT,
    ):
        self.directory = directory
        self.specials = specials  # the ids collation adds: the target tokenizer's
        # the paths as given now: the cache may have been written from another working directory
        stored = {**meta["summary"], "src_path": str(src_path), "tgt_path": str(tgt_path)}
        self.summary = CorpusSummary(**stored, cache=str(directory), from_cache=from_cache)
        self.num_pairs = int(meta["num_pairs"])
        self.src_prefix: list[int] = [int(i) for i in meta.get("key_inputs", {}).get("src_prefix", [])]
        self.tgt_prefix: list[int] = [int(i) for i in meta.get("key_inputs", {}).get("tgt_prefix", [])]
        arrays = map_arrays(directory, meta)
        self._src_tokens, self._tgt_tokens = arrays["src.tokens"], arrays["tgt.tokens"]
        self._src_offsets, self._tgt_offsets = arrays["src.offsets"], arrays["tgt.offsets"]
        self.src_lengths = np.array(arrays["src.lengths"])  # in memory: batching sorts them every epoch
        self.tgt_lengths = np.array(arrays["tgt.lengths"])
        self.line_numbers = arrays["lines"]
        self._memo: tuple[tuple, list[np.ndarray]] | None = None

    def __len__(self) -> int:
        return self.num_pairs

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target piece ids of pair i, without EOS / BOS."""
        s, t = int(self._src_offsets[i]), int(self._tgt_offsets[i])
        return self._src_tokens[s : s + self.src_lengths[i]], self._tgt_tokens[t : t + self.tgt_lengths[i]]

    def batches(self, epoch: int, *, max_tokens: int, seed: int, shuffle: bool = True) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches of pair indices (see :func:`make_batches`); deterministic."""
        args = (epoch, max_tokens, seed, shuffle)
        if self._memo is None or self._memo[0] != args:
            # +1: the EOS on the source and the BOS / EOS on the target occupy a position each
            self._memo = (
                args,
                make_batches(
                    self.src_lengths + 1, self.tgt_lengths + 1, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle
                ),
            )
        return list(self._memo[1])  # a copy: callers may reorder or slice it

    def get_batch(self, indices: Ids, *, pad_to_multiple: int = 0) -> Batch:
        """The :class:`Batch` of the pairs ``indices``, in that order (``pad_to_multiple``: :func:`collate`'s)."""
        return collate_pairs(self, indices, pad_to_multiple=pad_to_multiple)

    def subset(self, keep: np.ndarray) -> ParallelData:
        """A view of the pairs where ``keep`` (N,) bool is True, renumbered 0..kept-1 (e.g. the validation
        pairs a model can take); the token files are shared, not copied."""
        view = copy.copy(self)
        rows = np.flatnonzero(keep)
        view._src_offsets, view._tgt_offsets = self._src_offsets[rows], self._tgt_offsets[rows]
        view.src_lengths, view.tgt_lengths = self.src_lengths[rows], self.tgt_lengths[rows]
        view.line_numbers, view.num_pairs, view._memo = self.line_numbers[rows], int(rows.size), None
        return view

    def texts(self, side: str) -> list[str]:
        """The stripped text lines of the kept pairs on ``side`` ("src" or "tgt"), e.g. BLEU references."""
        path = {"src": self.summary.src_path, "tgt": self.summary.tgt_path}[side]
        wanted = iter(self.line_numbers.tolist())
        out, want = [], next(wanted, None)
        for lineno, line in enumerate(iter_file(path)):
            if lineno == want:
                out.append(line.strip())
                want = next(wanted, None)
        return out


def load_parallel(
    src_path: str | os.PathLike,
    tgt_path: str | os.PathLike,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    data_cfg: DataConfig,
    *,
    cache_dir: str | os.PathLike,
    filter_long: bool = True,
    quiet: bool = False,
    src_prefix: Sequence[int] = (),
    tgt_prefix: Sequence[int] = (),
    pair_filter: PairFilter | None = None,
    keys: tuple[str, str] | None = None,
    label: str = "",
) -> ParallelData:
    """Load a parallel corpus, encoding it into ``cache_dir`` unless an up-to-date cache is there.

    ``filter_long=False`` (validation sets) drops only empty pairs. ``src_prefix``: tag ids every source starts
    with, ``tgt_prefix`` every target; ``pair_filter``: cleaning rules over the raw pairs (``data.filters``).
    ``keys`` (the config keys of the two files, e.g. ``data.corpora[1].src``) and ``label`` (the corpus, e.g.
    ``data.corpora[1] (fr)``) name them in messages. Raises :class:`DataError` for missing files, unequal line
    counts and invalid UTF-8. Ranks of a distributed run should let rank 0 build the cache before the others load it
    (concurrent builds are safe, only wasteful).
    """
    if not str(cache_dir):
        raise ValueError(
            "cache_dir is empty; pass a directory (load_corpora uses data.cache_dir, else <train.out_dir>/cache)"
        )
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    for i, path in enumerate((src_path, tgt_path)):
        if not path.is_file():
            raise DataError(
                f"{keys[i]}: {path}: file not found; check the path (relative paths start from the current directory)"
                if keys
                else f"{path}: file not found; check the data paths "
                "(data.train_src / train_tgt / valid_src / valid_tgt)"
            )
    key, inputs = cache_key(
        src_path,
        tgt_path,
        src_tok,
        tgt_tok,
        data_cfg,
        filter_long=filter_long,
        src_prefix=src_prefix,
        tgt_prefix=tgt_prefix,
        filters=None if pair_filter is None else pair_filter.key(),
    )
    directory = cache_directory(cache_dir, src_path, tgt_path, key)
    meta = read_meta(directory, key)
    if meta is not None:
        return ParallelData(directory, meta, src_path, tgt_path, from_cache=True, specials=tgt_tok.specials)
    try:
        _encode_corpus(
            src_path,
            tgt_path,
            (src_tok, tgt_tok),
            data_cfg,
            directory,
            key,
            inputs,
            filter_long=filter_long,
            quiet=quiet,
            src_prefix=list(src_prefix),
            tgt_prefix=list(tgt_prefix),
            pair_filter=pair_filter,
            label=label,
        )
    except OSError as exc:
        if exc.filename is not None and not str(exc.filename).startswith(str(directory.parent)):
            raise  # about an input file: the command line names it
        # numpy's tofile says only "N requested and 0 written" when the disk is full
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise DataError(
            f"{directory}: could not write the encoded corpus cache ({reason}); free disk space, or set data.cache_dir "
            "to a disk with room (nothing was kept: the next run encodes again)"
        ) from exc
    meta = read_meta(directory, key)
    if meta is None:
        raise DataError(
            f"{directory}: the cache just written does not read back; "
            "check the disk (space, permissions) and delete the directory"
        )
    return ParallelData(directory, meta, src_path, tgt_path, from_cache=False, specials=tgt_tok.specials)


# --------------------------------------------------------------------------- reading and encoding


def _aligned_chunks(src_path: Path, tgt_path: Path) -> Iterator[tuple[list[int], list[str], list[str], int, int]]:
    """Yield (0-based line numbers, sources, targets, lines read, empty pairs) per CHUNK_LINES lines."""
    lines = enumerate(zip(iter_file(src_path), iter_file(tgt_path)))
    while chunk := list(itertools.islice(lines, CHUNK_LINES)):
        numbers, srcs, tgts = [], [], []
        for lineno, (s, t) in chunk:
            s, t = s.strip(), t.strip()
            if s and t:
                numbers.append(lineno)
                srcs.append(s)
                tgts.append(t)
        yield numbers, srcs, tgts, len(chunk), len(chunk) - len(numbers)


def _encode_corpus(
    src_path: Path,
    tgt_path: Path,
    toks: tuple[Tokenizer, Tokenizer],
    cfg: DataConfig,
    directory: Path,
    key: str,
    inputs: dict,
    *,
    filter_long: bool,
    quiet: bool,
    src_prefix: list[int],
    tgt_prefix: list[int],
    pair_filter: PairFilter | None,
    label: str,
) -> None:
    """Encode, filter and write the cache for ``key`` into a temporary directory, then rename it into place."""
    src_tok, tgt_tok = toks
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    if n_src != n_tgt:
        raise DataError(
            f"{label + ': ' if label else ''}{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
            "line i of one file must translate line i of the other, "
            "so fix the files to have the same number of lines"
        )
    summary = CorpusSummary(
        str(src_path),
        str(tgt_path),
        filtered=filter_long,
        max_len=cfg.max_len,
        max_len_ratio=cfg.max_len_ratio,
        min_len_for_ratio=cfg.min_len_for_ratio,
        cleaned=pair_filter is not None,
    )
    dtypes = {"src": token_dtype(src_tok), "tgt": token_dtype(tgt_tok)}
    tmp = temporary_directory(directory)
    try:
        writer = CacheWriter(tmp, dtypes, unk={"src": src_tok.specials.unk, "tgt": tgt_tok.specials.unk})
        bar = tqdm(
            total=n_src,
            unit=" lines",
            desc=f"encoding {src_path.name}-{tgt_path.name}",
            leave=False,
            disable=quiet or not sys.stderr.isatty(),
        )
        try:
            for numbers, srcs, tgts, n_read, n_empty in _aligned_chunks(src_path, tgt_path):
                summary.pairs_read += n_read
                summary.dropped_empty += n_empty
                if pair_filter is not None:
                    numbers, srcs, tgts = _cleaned(pair_filter, numbers, srcs, tgts, summary)
                encoded = {"src": src_tok.encode(srcs), "tgt": tgt_tok.encode(tgts)}
                lengths = {
                    side: np.fromiter(map(len, seqs), np.int64, count=len(seqs)) for side, seqs in encoded.items()
                }
                prefixes = {"src": src_prefix, "tgt": tgt_prefix}
                keep = _classify(
                    lengths["src"], lengths["tgt"], cfg, filter_long, summary, prefix=(len(src_prefix), len(tgt_prefix))
                )
                for side, prefix in prefixes.items():
                    if prefix:  # the tags (an NLLB model's codes) head every sentence, stored with it
                        encoded[side] = [prefix + ids for ids in encoded[side]]
                        lengths[side] += len(prefix)
                writer.add(numbers, encoded, lengths, keep)
                bar.update(n_read)
            writer.sync()  # data on disk before meta.json and the rename make it count
        finally:
            bar.close()
            writer.close()
        if summary.pairs_read != n_src:
            raise DataError(
                f"{src_path}: read {summary.pairs_read} lines after counting {n_src}; "
                "a file changed while it was encoded, run again"
            )
        for side, stats in writer.stats.items():
            setattr(summary, f"{side}_tokens", stats["tokens"])
            setattr(summary, f"{side}_unk", stats["unk"])
            setattr(summary, f"{side}_max", stats["max"])
        stored = {k: v for k, v in dataclasses.asdict(summary).items() if k not in _NOT_STORED}
        if not summary.cleaned:  # a corpus encoded without filters keeps the meta.json it always had
            del stored["cleaned"], stored["dropped_filtered"], stored["filtered_by"]
        write_meta(tmp, key=key, inputs=inputs, summary=stored, writer=writer)
        publish(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_NOT_STORED = ("cache", "from_cache", "name")  # CorpusSummary fields of this load, not of the cache


def _cleaned(
    pair_filter: PairFilter, numbers: list[int], srcs: list[str], tgts: list[str], summary: CorpusSummary
) -> tuple[list[int], list[str], list[str]]:
    """The pairs of a chunk that the cleaning rules keep, the others counted by rule."""
    verdicts = list(pair_filter.check(srcs, tgts))
    if len(verdicts) != len(srcs):
        raise ValueError(f"a pair filter answered {len(verdicts)} verdicts for {len(srcs)} pairs")
    rows = [i for i, verdict in enumerate(verdicts) if verdict == "keep"]
    summary.dropped_filtered += len(srcs) - len(rows)
    for verdict in verdicts:
        if verdict != "keep":
            summary.filtered_by[verdict] = summary.filtered_by.get(verdict, 0) + 1
    return [numbers[i] for i in rows], [srcs[i] for i in rows], [tgts[i] for i in rows]


def _classify(
    ls: np.ndarray,
    lt: np.ndarray,
    cfg: DataConfig,
    filter_long: bool,
    summary: CorpusSummary,
    *,
    prefix: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """Boolean keep-mask for one chunk of encoded pairs; counts each drop under its first reason. ``ls`` / ``lt``
    are the pieces without the ``prefix`` tags (source, target), which count towards max_len only."""
    empty = (ls == 0) | (lt == 0)  # whitespace or control characters only, removed by normalisation
    too_long = ~empty & ((ls + prefix[0] > cfg.max_len) | (lt + prefix[1] > cfg.max_len))
    longer, shorter = np.maximum(ls, lt), np.minimum(ls, lt)
    ratio = ~empty & ~too_long & (longer >= cfg.min_len_for_ratio) & (longer > cfg.max_len_ratio * shorter)
    summary.dropped_empty += int(empty.sum())
    if filter_long:
        summary.dropped_too_long += int(too_long.sum())
        summary.dropped_ratio += int(ratio.sum())
        keep = ~(empty | too_long | ratio)
    else:
        summary.long_kept += int((too_long | ratio).sum())
        keep = ~empty
    summary.kept += int(keep.sum())
    return keep
