"""Parallel corpora: aligned reading, validation, an on-disk cache of encoded pairs,
token-budget batches, and the :class:`Batch` that builds teacher forcing in one place.

Conventions (fairseq's, section 5 of the paper): a source is its pieces + EOS; the decoder
input ``tgt_in`` is BOS + target pieces; the labels ``tgt_out`` are target pieces + EOS.
Sequences are right-padded with PAD_ID. :func:`collate` is the only code that adds them.

Reading. Lines are read by :mod:`transformer_mt.text.textio`'s rules, the same as every other reader
(strict UTF-8, split at b"\\n" only, a last line without one counts, BOM removed); each line is
stripped of surrounding whitespace. Pairs with an empty side are dropped
and counted, for training and validation alike. With ``filter_long`` (training) pairs with more
than ``max_len`` pieces on a side, or whose longer side has at least ``min_len_for_ratio``
pieces and more than ``max_len_ratio`` times the pieces of the shorter, are dropped too; each
dropped pair is counted under the first of empty, too long, ratio that applies. Validation sets
are loaded with ``filter_long=False``: nothing but empty pairs is dropped, and the summary
counts the kept pairs the filters would have removed (``long_kept``).

Cache. A corpus is encoded once, in chunks of 10k lines, into ``<cache_dir>/<src>-<tgt>-<key16>/``::

    meta.json      format version, full key, key inputs, counts, dtypes, the CorpusSummary
    src.tokens     flat piece ids of all kept sources, no EOS; uint16 if vocab < 65536 else int32
    src.offsets    int64 (N,), start of pair i in src.tokens
    src.lengths    int32 (N,), pieces of pair i
    tgt.tokens / tgt.offsets / tgt.lengths   the same for targets
    lines          int64 (N,), 0-based line number of pair i in the text files

Everything is raw little-endian arrays (``np.fromfile`` / ``np.memmap`` read them), written into
a temporary directory that is renamed into place after meta.json, so a crash never leaves a
directory that looks valid. The key is a sha256 of: the format version; per text file its
resolved path, size, mtime_ns and a hash of its first and last 64 KiB (O(1) however large the
corpus: a full content hash of a 4.5M-pair corpus would cost seconds on every start); the
sha256 of each sentencepiece model; the sentencepiece version; max_len, max_len_ratio,
min_len_for_ratio and filter_long. Change any of them and the corpus is re-encoded; stale
directories are left in place (delete them freely, as any ``*.tmp-*`` left by a crash).

Batches. Pairs are sorted by (target length, source length) with a seeded random tie-break and
cut greedily into batches whose padded size, max(len) x count on each side, stays within
``max_tokens`` (a pair over budget alone forms a batch); batch order is then shuffled. Both draw
on ``numpy.random.default_rng([seed, epoch])`` (a seed sequence, so that (seed=1, epoch=2) and
(seed=2, epoch=1) differ, unlike seed + epoch): epoch e's batches are a pure function of
(seed, epoch), and a run resumed at batch k of an epoch sees exactly the remaining batches.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import os
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import sentencepiece as spm
import torch
from tqdm import tqdm

from transformer_mt.config import DataConfig
from transformer_mt.errors import TmtError
from transformer_mt.text import count_lines, iter_file
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

FORMAT_VERSION = 1
CHUNK_LINES = 10_000  # lines encoded at a time: bounds memory whatever the corpus size
_FINGERPRINT_BYTES = 1 << 16  # head and tail hashed into the cache key
_INDEX_FILES = {"offsets": np.int64, "lengths": np.int32}


class DataError(TmtError, ValueError):
    """A corpus problem worded for the user: one line naming the file, the line and the fix."""


@dataclass
class CorpusSummary:
    """What loading a parallel corpus read, kept and dropped."""

    src_path: str
    tgt_path: str
    filtered: bool = True  # max_len and ratio filters applied (training) or only counted (validation)
    max_len: int = 0
    max_len_ratio: float = 0.0
    min_len_for_ratio: int = 0
    pairs_read: int = 0  # lines in each file
    kept: int = 0
    dropped_empty: int = 0  # empty or whitespace-only on either side (or no pieces after normalisation)
    dropped_too_long: int = 0  # more than max_len pieces on either side
    dropped_ratio: int = 0  # longer side > max_len_ratio x shorter side
    long_kept: int = 0  # kept pairs the filters would have dropped (only when filtered is False)
    src_tokens: int = 0  # pieces in the kept sources, EOS not counted
    tgt_tokens: int = 0  # pieces in the kept targets, EOS not counted
    src_unk: int = 0  # <unk> pieces among src_tokens
    tgt_unk: int = 0
    src_max: int = 0  # longest kept source, in pieces
    tgt_max: int = 0
    cache: str = ""  # the cache directory
    from_cache: bool = False  # True when this load found the corpus already encoded

    def format(self) -> str:
        """A few lines for the log."""

        def side(name: str, tokens: int, unk: int, longest: int) -> str:
            avg = tokens / self.kept if self.kept else 0.0
            return f"{name} {tokens:,} (avg {avg:.1f}, max {longest}, unk {100 * unk / max(tokens, 1):.2f}%)"

        if self.filtered:
            dropped = (f"dropped: {self.dropped_empty:,} empty, {self.dropped_too_long:,} over {self.max_len} pieces, "
                       f"{self.dropped_ratio:,} with length ratio over {self.max_len_ratio:g}")
        else:
            dropped = (f"dropped: {self.dropped_empty:,} empty; not length-filtered: {self.long_kept:,} kept pairs are over "
                       f"{self.max_len} pieces or length ratio {self.max_len_ratio:g}")
        return "\n".join([
            f"{self.src_path} -> {self.tgt_path}: {self.pairs_read:,} pairs read, {self.kept:,} kept ({100 * self.kept / max(self.pairs_read, 1):.2f}%)",
            f"  {dropped}",
            "  tokens: " + side("source", self.src_tokens, self.src_unk, self.src_max) + ", " + side("target", self.tgt_tokens, self.tgt_unk, self.tgt_max),
            f"  cache: {self.cache} ({'loaded' if self.from_cache else 'written'})",
        ])


# --------------------------------------------------------------------------- the Batch


@dataclass
class Batch:
    """One batch of sentence pairs; teacher forcing is built here and nowhere else.

    src:      (B, S) long, source pieces + EOS, right-padded with PAD_ID
    tgt_in:   (B, T) long, BOS + target pieces (decoder input, the target shifted right), padded
    tgt_out:  (B, T) long, target pieces + EOS (labels), padded; the loss ignores PAD_ID
    ntokens:  non-pad tokens of tgt_out (target pieces + 1 per sentence), the loss normaliser
    nsentences: B
    indices:  (B,) long or None, pair indices in the ParallelData (its ``line_numbers`` map them to lines)
    labels:   (ntokens,) long or None, the flat positions (row-major in (B, T)) of tgt_out's non-pad labels,
              known here from the lengths: the loss selects them without asking the device (a boolean
              mask would make the host wait for the GPU, twice: forward and backward)
    src_padded: whether any source row is shorter than S (False: attention over the source needs no mask)
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    ntokens: int
    nsentences: int
    indices: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    src_padded: bool = True

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> "Batch":
        """The batch on ``device``. ``non_blocking`` to CUDA copies from page-locked (pinned) memory, so that
        the host neither waits for the copy nor for the GPU (a copy from pageable memory synchronises the stream)."""
        pin = non_blocking and torch.device(device).type == "cuda"

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            return (t.pin_memory() if pin and not t.is_pinned() else t).to(device, non_blocking=non_blocking)

        return dataclasses.replace(self, src=move(self.src), tgt_in=move(self.tgt_in), tgt_out=move(self.tgt_out), indices=move(self.indices),
                                   labels=move(self.labels))


def _pad(seqs: Sequence[Sequence[int]], *, prefix: int | None = None, suffix: int | None = None) -> torch.Tensor:
    """(B, max len + extras) int64 rows of prefix + seq + suffix, right-padded with PAD_ID."""
    lengths = [len(s) for s in seqs]
    start = int(prefix is not None)
    out = np.full((len(seqs), max(lengths, default=0) + start + int(suffix is not None)), PAD_ID, dtype=np.int64)
    for row, (seq, n) in enumerate(zip(seqs, lengths)):
        if prefix is not None:
            out[row, 0] = prefix
        out[row, start:start + n] = seq
        if suffix is not None:
            out[row, start + n] = suffix
    return torch.from_numpy(out)


def source_tensor(seqs: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, S) long: each source's pieces + EOS, right-padded with PAD_ID (also for translation)."""
    return _pad(seqs, suffix=EOS_ID)


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, indices: Sequence[int] | None = None) -> Batch:
    """Build a :class:`Batch` from (source ids, target ids) pairs given without BOS/EOS."""
    srcs = [p[0] for p in pairs]
    tgts = [p[1] for p in pairs]
    src_lengths = np.fromiter(map(len, srcs), np.int64, count=len(srcs))
    labels_per_row = np.fromiter(map(len, tgts), np.int64, count=len(tgts)) + 1  # pieces + EOS
    tgt_out = _pad(tgts, suffix=EOS_ID)  # (B, T)
    return Batch(
        src=source_tensor(srcs),
        tgt_in=_pad(tgts, prefix=BOS_ID),  # section 5: the decoder input is the target shifted right
        tgt_out=tgt_out,
        ntokens=int(labels_per_row.sum()),
        nsentences=len(pairs),
        indices=None if indices is None else torch.as_tensor(np.asarray(indices, dtype=np.int64)),
        labels=torch.from_numpy(np.flatnonzero(np.arange(tgt_out.size(1)) < labels_per_row[:, None])),  # (B, T) -> (ntokens,)
        src_padded=bool(src_lengths.size and src_lengths.min() < src_lengths.max()),
    )


# --------------------------------------------------------------------------- batching


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFF_FFFF_FFFF_FFFF, epoch & 0xFFFF_FFFF_FFFF_FFFF])


def make_batches(lengths_src, lengths_tgt, max_tokens: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """Split pair indices into batches of at most ``max_tokens`` padded tokens per side.

    ``lengths_*`` (N,) are the lengths the pairs occupy in the padded tensors (ParallelData passes
    pieces + 1 for the EOS / BOS). A batch's size on a side is max(length) x count; a single pair
    over budget forms its own batch. Pairs are sorted by (target, source) length, ties broken by a
    random permutation drawn from (seed, epoch); batch order is shuffled from the same generator.
    With ``shuffle=False`` ties keep index order and batches stay shortest-first (for evaluation).
    Returns a list of int64 arrays of pair indices covering every pair exactly once.
    """
    ls = np.asarray(lengths_src, dtype=np.int64)
    lt = np.asarray(lengths_tgt, dtype=np.int64)
    if ls.shape != lt.shape or ls.ndim != 1:
        raise ValueError(f"lengths_src {ls.shape} and lengths_tgt {lt.shape} must be 1-D and of equal size")
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be at least 1")
    if ls.size == 0:
        return []
    rng = _rng(seed, epoch)
    tiebreak = rng.permutation(ls.size) if shuffle else np.arange(ls.size)
    order = tiebreak[np.lexsort((ls[tiebreak], lt[tiebreak]))]  # lexsort is stable: the last key is primary
    # Greedy cut along the sorted order: a batch starting at i holds at most
    # max_tokens // max(ls[i], lt[i]) pairs, and as pairs are added its size, max(running max) x
    # count, never decreases (target lengths are sorted), so one searchsorted finds where it ends.
    s_sorted, t_sorted = ls[order], lt[order]
    cuts, i = [], 0
    while i < order.size:
        window = slice(i, i + max(1, max_tokens // max(int(s_sorted[i]), int(t_sorted[i]))))
        longest = np.maximum(np.maximum.accumulate(s_sorted[window]), t_sorted[window])
        sizes = longest * np.arange(1, longest.size + 1)
        i += max(1, int(np.searchsorted(sizes, max_tokens, side="right")))  # a pair over budget goes alone
        cuts.append(i)
    batches = np.split(order, cuts[:-1])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shard(batches: Sequence, rank: int, world_size: int, *, drop_remainder: bool = True) -> list:
    """Rank r's share for data-parallel training: batches r, r + W, r + 2W, ...

    With ``drop_remainder`` (training) the last len % W batches are dropped so every rank takes
    the same number of steps; they differ each epoch, so no pair is left out for good. Use
    ``drop_remainder=False`` for evaluation, where every pair counts and ranks may differ by one.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
    end = len(batches) // world_size * world_size if drop_remainder else len(batches)
    return list(batches[rank:end:world_size])


# --------------------------------------------------------------------------- the encoded corpus


class ParallelData:
    """An encoded parallel corpus, memory-mapped from its cache directory.

    ``src_lengths`` / ``tgt_lengths`` (N,) int32 are piece counts without EOS / BOS;
    ``line_numbers`` (N,) int64 are 0-based lines of the text files the pairs came from.
    """

    def __init__(self, directory: Path, meta: dict, src_path: Path, tgt_path: Path, *, from_cache: bool):
        self.directory = directory
        # the paths as given now: the cache may have been written from another working directory
        stored = {**meta["summary"], "src_path": str(src_path), "tgt_path": str(tgt_path)}
        self.summary = CorpusSummary(**stored, cache=str(directory), from_cache=from_cache)
        self.num_pairs = int(meta["num_pairs"])
        arrays = _map_arrays(directory, meta)
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
        return self._src_tokens[s:s + self.src_lengths[i]], self._tgt_tokens[t:t + self.tgt_lengths[i]]

    def batches(self, epoch: int, *, max_tokens: int, seed: int, shuffle: bool = True) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches of pair indices (see :func:`make_batches`); deterministic."""
        args = (epoch, max_tokens, seed, shuffle)
        if self._memo is None or self._memo[0] != args:
            # +1: the EOS on the source and the BOS / EOS on the target occupy a position each
            self._memo = (args, make_batches(self.src_lengths + 1, self.tgt_lengths + 1, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle))
        return list(self._memo[1])  # a copy: callers may reorder or slice it

    def get_batch(self, indices: Sequence[int]) -> Batch:
        """The :class:`Batch` of the pairs ``indices``, in that order."""
        return collate([self.pair(int(i)) for i in indices], indices=indices)

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


class SampledSegmentation:
    """Subword regularisation (Kudo, 2018; BPE-dropout for bpe models): a training corpus whose
    pairs are re-segmented by sampling at the start of every epoch.

    It reads the kept pairs' text once and keeps it in memory; each epoch both sides are encoded
    again with sentencepiece sampling (unigram: from the n best segmentations, smoothed by
    ``alpha``; bpe: merges dropped with probability ``alpha``). The same (seed, epoch) always gives
    the same segmentation: sentencepiece's generator is seeded before each side is encoded in one
    call on one thread (its multi-threaded encoder hands sentences to threads in a racy order).
    A resumed run and every rank of a distributed run therefore see the same pieces and batches.
    A pair whose sampled segmentation is longer than ``max_len`` on a side keeps its best
    segmentation for that epoch. Validation and translation never sample.

    It stands in for the :class:`ParallelData` it wraps: ``batches(epoch, ...)`` re-segments for
    that epoch and ``get_batch`` / ``pair`` read the segmentation of the epoch last batched.
    """

    def __init__(self, base: ParallelData, src_tok: Tokenizer, tgt_tok: Tokenizer, *, alpha: float, nbest: int, seed: int, max_len: int):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        self.base, self.summary, self.num_pairs, self.line_numbers = base, base.summary, base.num_pairs, base.line_numbers
        self.alpha, self.nbest, self.seed, self.max_len = alpha, nbest, seed, max_len
        self._toks = {"src": src_tok, "tgt": tgt_tok}
        self._texts = {side: base.texts(side) for side in ("src", "tgt")}
        self._epoch: int | None = None
        self._tokens: dict[str, np.ndarray] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self.src_lengths, self.tgt_lengths = base.src_lengths, base.tgt_lengths
        self.last_stats: dict[str, float] = {}  # of the latest re-segmentation: seconds, piece ratios to the best segmentation

    def __len__(self) -> int:
        return self.num_pairs

    def texts(self, side: str) -> list[str]:
        return list(self._texts[side])

    def segment(self, epoch: int) -> None:
        """Sample epoch ``epoch``'s segmentation of every pair (a no-op if it is the current one)."""
        if epoch == self._epoch:
            return
        tic = time.perf_counter()
        stats: dict[str, float] = {}
        for k, side in enumerate(("src", "tgt")):
            best = getattr(self.base, f"{side}_lengths")
            spm.set_random_generator_seed(int(np.random.SeedSequence([self.seed & 0xFFFF_FFFF, epoch & 0xFFFF_FFFF, k]).generate_state(1)[0]))
            seqs = self._toks[side].sp.encode(self._texts[side], out_type=int, enable_sampling=True, alpha=self.alpha,
                                              nbest_size=self.nbest, num_threads=1)
            lengths = np.fromiter(map(len, seqs), np.int32, count=len(seqs))
            for i in np.flatnonzero(lengths > self.max_len).tolist():  # too long this epoch: the best one
                seqs[i] = self.base.pair(i)[k].tolist()
                lengths[i] = best[i]
            self._tokens[side] = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, count=int(lengths.sum()))
            self._offsets[side] = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))) if len(lengths) else np.zeros(0, np.int64)
            setattr(self, f"{side}_lengths", lengths)
            stats[f"{side}_piece_ratio"] = float(lengths.sum()) / max(int(best.sum()), 1)
        self._epoch = epoch
        self.last_stats = {"epoch": epoch, "seconds": time.perf_counter() - tic, **stats}

    def batches(self, epoch: int, *, max_tokens: int, seed: int, shuffle: bool = True) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches over its sampled lengths (see :func:`make_batches`); deterministic."""
        self.segment(epoch)
        return make_batches(self.src_lengths + 1, self.tgt_lengths + 1, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Pair i as segmented for the current epoch (its best segmentation before the first)."""
        if self._epoch is None:
            return self.base.pair(i)
        s, t = int(self._offsets["src"][i]), int(self._offsets["tgt"][i])
        return self._tokens["src"][s:s + self.src_lengths[i]], self._tokens["tgt"][t:t + self.tgt_lengths[i]]

    get_batch = ParallelData.get_batch  # the same collation, over this epoch's pairs


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
) -> ParallelData:
    """Load a parallel corpus, encoding it into ``cache_dir`` unless an up-to-date cache is there.

    ``filter_long=False`` (validation sets) drops only empty pairs. Raises :class:`DataError` for
    missing files, unequal line counts and invalid UTF-8. Ranks of a distributed run should let
    rank 0 build the cache before the others load it (concurrent builds are safe, only wasteful).
    """
    if not str(cache_dir):
        raise ValueError("cache_dir is empty; pass a directory (train.py uses <train.out_dir>/cache)")
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    for path in (src_path, tgt_path):
        if not path.is_file():
            raise DataError(f"{path}: file not found; check the data paths (data.train_src / train_tgt / valid_src / valid_tgt)")
    key, inputs = cache_key(src_path, tgt_path, src_tok, tgt_tok, data_cfg, filter_long=filter_long)
    directory = Path(cache_dir) / f"{src_path.name}-{tgt_path.name}-{key[:16]}"
    meta = _read_meta(directory, key)
    if meta is not None:
        return ParallelData(directory, meta, src_path, tgt_path, from_cache=True)
    try:
        _encode_corpus(src_path, tgt_path, src_tok, tgt_tok, data_cfg, directory, key, inputs, filter_long=filter_long, quiet=quiet)
    except OSError as exc:
        if exc.filename is not None and not str(exc.filename).startswith(str(directory.parent)):
            raise  # about an input file: the command line names it
        # numpy's tofile says only "N requested and 0 written" when the disk is full
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise DataError(f"{directory}: could not write the encoded corpus cache ({reason}); free disk space, or set data.cache_dir "
                        "to a disk with room (nothing was kept: the next run encodes again)") from exc
    meta = _read_meta(directory, key)
    if meta is None:
        raise DataError(f"{directory}: the cache just written does not read back; check the disk (space, permissions) and delete the directory")
    return ParallelData(directory, meta, src_path, tgt_path, from_cache=False)


# --------------------------------------------------------------------------- cache key and files


def cache_key(src_path: Path, tgt_path: Path, src_tok: Tokenizer, tgt_tok: Tokenizer, cfg: DataConfig, *, filter_long: bool) -> tuple[str, dict]:
    """(sha256 hex key, the inputs it hashes) for the encoded corpus; see the module docstring."""
    inputs = {
        "format": FORMAT_VERSION,
        "src": _fingerprint(src_path),
        "tgt": _fingerprint(tgt_path),
        "src_model": hashlib.sha256(src_tok.proto).hexdigest(),
        "tgt_model": hashlib.sha256(tgt_tok.proto).hexdigest(),
        "sentencepiece": spm.__version__,
        "max_len": cfg.max_len,
        "max_len_ratio": cfg.max_len_ratio,
        "min_len_for_ratio": cfg.min_len_for_ratio,
        "filter_long": filter_long,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest(), inputs


def _fingerprint(path: Path) -> dict:
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(_FINGERPRINT_BYTES))
        if stat.st_size > _FINGERPRINT_BYTES:
            handle.seek(max(_FINGERPRINT_BYTES, stat.st_size - _FINGERPRINT_BYTES))
            digest.update(handle.read())
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head_tail_sha256": digest.hexdigest()}


def _file_specs(meta: dict) -> dict[str, tuple[np.dtype, int]]:
    """Name -> (dtype, element count) of every array file of a cache directory."""
    n = int(meta["num_pairs"])
    specs = {"lines": (np.dtype(np.int64), n)}
    for side in ("src", "tgt"):
        specs[f"{side}.tokens"] = (np.dtype(meta[side]["dtype"]), int(meta[side]["num_tokens"]))
        for name, dtype in _INDEX_FILES.items():
            specs[f"{side}.{name}"] = (np.dtype(dtype), n)
    return specs


def _read_meta(directory: Path, key: str) -> dict | None:
    """meta.json if the directory is a complete cache for ``key``, else None."""
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION or meta.get("key") != key:
            return None
        for name, (dtype, count) in _file_specs(meta).items():
            if (directory / name).stat().st_size != dtype.itemsize * count:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta


def _map_arrays(directory: Path, meta: dict) -> dict[str, np.ndarray]:
    out = {}
    for name, (dtype, count) in _file_specs(meta).items():
        # np.memmap cannot map an empty file
        out[name] = np.memmap(directory / name, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    return out


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


def _token_dtype(tok: Tokenizer) -> np.dtype:
    return np.dtype(np.uint16 if tok.vocab_size < 65536 else np.int32)


class _CacheWriter:
    """Appends kept pairs, chunk by chunk, to the array files of a (temporary) cache directory."""

    def __init__(self, directory: Path, dtypes: dict[str, np.dtype]):
        self.dtypes = dtypes
        names = ["lines"] + [f"{side}.{name}" for side in dtypes for name in ("tokens", *_INDEX_FILES)]
        self.files = {name: open(directory / name, "wb") for name in names}
        self.stats = {side: {"tokens": 0, "unk": 0, "max": 0} for side in dtypes}

    def add(self, numbers: list[int], encoded: dict[str, list[list[int]]], lengths: dict[str, np.ndarray], keep: np.ndarray) -> None:
        np.asarray(numbers, dtype=np.int64)[keep].tofile(self.files["lines"])
        rows = np.flatnonzero(keep)
        for side, seqs in encoded.items():
            kept, stats = lengths[side][keep], self.stats[side]
            flat = np.fromiter(itertools.chain.from_iterable(seqs[i] for i in rows), self.dtypes[side], count=int(kept.sum()))
            flat.tofile(self.files[f"{side}.tokens"])
            (stats["tokens"] + np.cumsum(kept) - kept).astype(np.int64).tofile(self.files[f"{side}.offsets"])
            kept.astype(np.int32).tofile(self.files[f"{side}.lengths"])
            stats["tokens"] += flat.size
            stats["unk"] += int(np.count_nonzero(flat == UNK_ID))
            stats["max"] = max(stats["max"], int(kept.max(initial=0)))

    def sync(self) -> None:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


def _encode_corpus(src_path, tgt_path, src_tok, tgt_tok, cfg: DataConfig, directory: Path, key: str, inputs: dict, *, filter_long: bool, quiet: bool) -> None:
    """Encode, filter and write the cache for ``key`` into a temporary directory, then rename it into place."""
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    if n_src != n_tgt:
        raise DataError(
            f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; line i of one file must translate line i of the other, "
            "so fix the files to have the same number of lines"
        )
    summary = CorpusSummary(str(src_path), str(tgt_path), filtered=filter_long, max_len=cfg.max_len,
                            max_len_ratio=cfg.max_len_ratio, min_len_for_ratio=cfg.min_len_for_ratio)
    dtypes = {"src": _token_dtype(src_tok), "tgt": _token_dtype(tgt_tok)}
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        writer = _CacheWriter(tmp, dtypes)
        bar = tqdm(total=n_src, unit=" lines", desc=f"encoding {src_path.name}-{tgt_path.name}", leave=False,
                   disable=quiet or not sys.stderr.isatty())
        try:
            for numbers, srcs, tgts, n_read, n_empty in _aligned_chunks(src_path, tgt_path):
                encoded = {"src": src_tok.encode(srcs), "tgt": tgt_tok.encode(tgts)}
                lengths = {side: np.fromiter(map(len, seqs), np.int64, count=len(seqs)) for side, seqs in encoded.items()}
                summary.pairs_read += n_read
                summary.dropped_empty += n_empty
                writer.add(numbers, encoded, lengths, _classify(lengths["src"], lengths["tgt"], cfg, filter_long, summary))
                bar.update(n_read)
            writer.sync()  # data on disk before meta.json and the rename make it count
        finally:
            bar.close()
            writer.close()
        if summary.pairs_read != n_src:
            raise DataError(f"{src_path}: read {summary.pairs_read} lines after counting {n_src}; a file changed while it was encoded, run again")
        for side, stats in writer.stats.items():
            setattr(summary, f"{side}_tokens", stats["tokens"])
            setattr(summary, f"{side}_unk", stats["unk"])
            setattr(summary, f"{side}_max", stats["max"])
        stored = {k: v for k, v in dataclasses.asdict(summary).items() if k not in ("cache", "from_cache")}
        meta = {"format": FORMAT_VERSION, "key": key, "key_inputs": inputs, "num_pairs": summary.kept, "summary": stored}
        meta.update({side: {"dtype": dtypes[side].name, "num_tokens": writer.stats[side]["tokens"]} for side in dtypes})
        with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _classify(ls: np.ndarray, lt: np.ndarray, cfg: DataConfig, filter_long: bool, summary: CorpusSummary) -> np.ndarray:
    """Boolean keep-mask for one chunk of encoded pairs; counts each drop under its first reason."""
    empty = (ls == 0) | (lt == 0)  # whitespace or control characters only, removed by normalisation
    too_long = ~empty & ((ls > cfg.max_len) | (lt > cfg.max_len))
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


def _publish(tmp: Path, directory: Path) -> None:
    """Rename the finished ``tmp`` to ``directory``; an invalid leftover there is removed first."""
    if directory.exists():
        trash = directory.with_name(f"{directory.name}.tmp-stale-{secrets.token_hex(4)}")
        try:
            directory.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass
    try:
        tmp.rename(directory)
    except OSError:
        pass  # another process published the same key first; load_parallel reads (and checks) theirs
