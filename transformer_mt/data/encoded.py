"""The on-disk cache of an encoded parallel corpus: its key, its files, reading them back and writing them safely.

(Not to be confused with :mod:`transformer_mt.model.cache`, the decoder's key/value cache.)

A corpus is encoded once (by :func:`transformer_mt.data.corpus.load_parallel`, in chunks) into
``<cache_dir>/<src>-<tgt>-<key16>/``::

    meta.json      format version, full key, key inputs, counts, dtypes, the CorpusSummary
    src.tokens     flat piece ids of all kept sources, no EOS; uint16 if vocab < 65536 else int32
    src.offsets    int64 (N,), start of pair i in src.tokens
    src.lengths    int32 (N,), pieces of pair i
    tgt.tokens / tgt.offsets / tgt.lengths   the same for targets
    lines          int64 (N,), 0-based line number of pair i in the text files

Everything is raw little-endian arrays (``np.fromfile`` / ``np.memmap`` read them), written into
a temporary directory that is renamed into place after meta.json, so a crash never leaves a
directory that looks valid. The key is a sha256 of: the format version; per text file its
resolved path, size, mtime_ns, inode, ctime_ns and a hash of its first and last 64 KiB (O(1) however large the
corpus: a full content hash of a corpus of millions of pairs would cost seconds on every start); the
sha256 of each sentencepiece model; the sentencepiece version; max_len, max_len_ratio,
min_len_for_ratio and filter_long; and, only when a corpus has them (so that a corpus without them keeps its key),
the ids of the tags its sources start with (``src_prefix``) and the cleaning rules applied to its raw pairs with
the corpus's languages (``filters``). Change any of them and the corpus is re-encoded; stale
directories are left in place (delete them freely, as any ``*.tmp-*`` left by a crash).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from transformer_mt.config import DataConfig
from transformer_mt.text import Tokenizer

FORMAT_VERSION = 1
_FINGERPRINT_BYTES = 1 << 16  # head and tail hashed into the cache key
_INDEX_FILES = {"offsets": np.int64, "lengths": np.int32}


# --------------------------------------------------------------------------- the key and the directory


def cache_key(
    src_path: Path,
    tgt_path: Path,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    cfg: DataConfig,
    *,
    filter_long: bool,
    src_prefix: Sequence[int] = (),
    tgt_prefix: Sequence[int] = (),
    filters: dict | None = None,
) -> tuple[str, dict]:
    """(sha256 hex key, the inputs it hashes) for the encoded corpus; see the module docstring. ``src_prefix``: the
    tag ids every source starts with, ``tgt_prefix`` every target; ``filters``: what decides which raw pairs the
    cleaning rules drop (None: none)."""
    inputs = {
        "format": FORMAT_VERSION,
        "src": _fingerprint(src_path),
        "tgt": _fingerprint(tgt_path),
        "src_model": src_tok.fingerprint,  # the sentencepiece model's sha256 (and its vocabulary's, when it has one)
        "tgt_model": tgt_tok.fingerprint,
        "sentencepiece": spm.__version__,
        "max_len": cfg.max_len,
        "max_len_ratio": cfg.max_len_ratio,
        "min_len_for_ratio": cfg.min_len_for_ratio,
        "filter_long": filter_long,
    }
    if src_prefix:  # absent without tags: the key of a corpus without them stays what it always was
        inputs["src_prefix"] = [int(i) for i in src_prefix]
    if tgt_prefix:
        inputs["tgt_prefix"] = [int(i) for i in tgt_prefix]
    if filters:
        inputs["filters"] = filters
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest(), inputs


def _fingerprint(path: Path) -> dict:
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(_FINGERPRINT_BYTES))
        if stat.st_size > _FINGERPRINT_BYTES:
            handle.seek(max(_FINGERPRINT_BYTES, stat.st_size - _FINGERPRINT_BYTES))
            digest.update(handle.read())
    # inode and ctime: a write between the head and the tail changes ctime, which no tool can set back as
    # `cp -p`, `touch -r`, `rsync -t` and tar set back mtime; a file replaced by another gets a new inode
    identity = {"inode": stat.st_ino, "ctime_ns": stat.st_ctime_ns}
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        **identity,
        "head_tail_sha256": digest.hexdigest(),
    }


def cache_directory(cache_dir: str | os.PathLike, src_path: Path, tgt_path: Path, key: str) -> Path:
    """Where the corpus of ``key`` is cached: ``<cache_dir>/<src>-<tgt>-<key16>``."""
    return Path(cache_dir) / f"{src_path.name}-{tgt_path.name}-{key[:16]}"


# --------------------------------------------------------------------------- reading


def _file_specs(meta: dict) -> dict[str, tuple[np.dtype, int]]:
    """Name -> (dtype, element count) of every array file of a cache directory."""
    n = int(meta["num_pairs"])
    specs = {"lines": (np.dtype(np.int64), n)}
    for side in ("src", "tgt"):
        specs[f"{side}.tokens"] = (np.dtype(meta[side]["dtype"]), int(meta[side]["num_tokens"]))
        for name, dtype in _INDEX_FILES.items():
            specs[f"{side}.{name}"] = (np.dtype(dtype), n)
    return specs


def read_meta(directory: Path, key: str) -> dict | None:
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


def map_arrays(directory: Path, meta: dict) -> dict[str, np.ndarray]:
    """Every array file of a complete cache directory, memory-mapped read-only, by file name."""
    out = {}
    for name, (dtype, count) in _file_specs(meta).items():
        # np.memmap cannot map an empty file
        out[name] = np.memmap(directory / name, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
    return out


# --------------------------------------------------------------------------- writing


def token_dtype(tok: Tokenizer) -> np.dtype:
    """The dtype of a side's token file: uint16 where the vocabulary allows it."""
    return np.dtype(np.uint16 if tok.vocab_size < 65536 else np.int32)


def temporary_directory(directory: Path) -> Path:
    """A new, empty directory beside ``directory`` to write its cache into before :func:`publish`."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp.mkdir()
    return tmp


class CacheWriter:
    """Appends kept pairs, chunk by chunk, to the array files of a (temporary) cache directory."""

    def __init__(self, directory: Path, dtypes: dict[str, np.dtype], *, unk: dict[str, int]):
        self.dtypes, self.unk = dtypes, unk  # per side: the dtype of its ids, its unknown-piece id
        names = ["lines"] + [f"{side}.{name}" for side in dtypes for name in ("tokens", *_INDEX_FILES)]
        self.files = {name: open(directory / name, "wb") for name in names}
        self.stats = {side: {"tokens": 0, "unk": 0, "max": 0} for side in dtypes}

    def add(
        self, numbers: list[int], encoded: dict[str, list[list[int]]], lengths: dict[str, np.ndarray], keep: np.ndarray
    ) -> None:
        np.asarray(numbers, dtype=np.int64)[keep].tofile(self.files["lines"])
        rows = np.flatnonzero(keep)
        for side, seqs in encoded.items():
            kept, stats = lengths[side][keep], self.stats[side]
            flat = np.fromiter(
                itertools.chain.from_iterable(seqs[i] for i in rows), self.dtypes[side], count=int(kept.sum())
            )
            flat.tofile(self.files[f"{side}.tokens"])
            (stats["tokens"] + np.cumsum(kept) - kept).astype(np.int64).tofile(self.files[f"{side}.offsets"])
            kept.astype(np.int32).tofile(self.files[f"{side}.lengths"])
            stats["tokens"] += flat.size
            stats["unk"] += int(np.count_nonzero(flat == self.unk[side]))
            stats["max"] = max(stats["max"], int(kept.max(initial=0)))

    def sync(self) -> None:
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()


def write_meta(tmp: Path, *, key: str, inputs: dict, summary: dict, writer: CacheWriter) -> None:
    """Write meta.json (the stored CorpusSummary ``summary``, counts and dtypes) into ``tmp`` and sync it: the
    array files must be synced first, since a meta.json on disk is what makes a directory count as complete."""
    meta = {
        "format": FORMAT_VERSION,
        "key": key,
        "key_inputs": inputs,
        "num_pairs": summary["kept"],
        "summary": summary,
    }
    meta.update(
        {
            side: {"dtype": dtype.name, "num_tokens": writer.stats[side]["tokens"]}
            for side, dtype in writer.dtypes.items()
        }
    )
    with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def publish(tmp: Path, directory: Path) -> None:
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
