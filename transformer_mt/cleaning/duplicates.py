"""The duplicate rules: a pair seen before, the same (exact) or the same after normalisation (normalized).

A pair is remembered by an 8-byte BLAKE2b hash of its two sides, never by its text, in one numpy table kept at
most half full: 8 to 16 bytes per distinct pair whatever the length of its lines (10 million pairs: 128 to 256 MiB;
Python's own set would spend about 70 bytes on each hash). Two different pairs share a hash with probability
about n^2 / 2^65: one wrongly dropped pair in about 3,700 runs over 100 million pairs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from transformer_mt.cleaning.rules import normalize_for_duplicates

_SEPARATOR = b"\xff"  # never a byte of UTF-8, so ("ab", "c") and ("a", "bc") hash apart


def pair_hash(src: str, tgt: str) -> int:
    """A pair's 64-bit hash (never 0, the table's empty slot)."""
    data = src.encode("utf-8", "surrogatepass") + _SEPARATOR + tgt.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") or 1


class SeenHashes:
    """A set of 64-bit hashes: one uint64 array, open addressing with linear probing, grown (doubled) before it
    is more than half full; 0 marks an empty slot."""

    def __init__(self, capacity: int = 1 << 16):
        if capacity < 2 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, got {capacity}")
        self._table = np.zeros(capacity, dtype=np.uint64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """The table's memory in bytes."""
        return self._table.nbytes

    def add(self, hashes: np.ndarray) -> np.ndarray:
        """Insert ``hashes`` (uint64, none 0) in order. Returns a bool array, True where the hash is new: neither in
        the set before nor earlier in ``hashes``."""
        new = np.zeros(len(hashes), dtype=bool)
        if len(hashes) == 0:
            return new
        distinct, first = np.unique(hashes, return_index=True)
        self._reserve(self._size + len(distinct))
        new[first[self._insert(distinct)]] = True
        return new

    def _reserve(self, size: int) -> None:
        capacity = len(self._table)
        while 2 * size > capacity:
            capacity *= 2
        if capacity > len(self._table):
            kept = self._table[self._table != 0]
            self._table, self._size = np.zeros(capacity, dtype=np.uint64), 0
            self._insert(kept)

    def _insert(self, keys: np.ndarray) -> np.ndarray:
        """Insert distinct ``keys``; True where a key was not in the table. Every key probes its slots in step with
        the others; of several keys that reach one empty slot together, the first takes it, the others probe on."""
        mask = np.uint64(len(self._table) - 1)
        slots = keys & mask
        inserted = np.zeros(len(keys), dtype=bool)
        pending = np.arange(len(keys))
        while len(pending):
            found = self._table[slots[pending]]
            present = found == keys[pending]
            free = pending[found == 0]
            _, first = np.unique(slots[free], return_index=True)
            winners = free[first]
            self._table[slots[winners]] = keys[winners]
            inserted[winners] = True
            self._size += len(winners)
            done = np.zeros(len(keys), dtype=bool)
            done[pending[present]] = True
            done[winners] = True
            pending = pending[~done[pending]]
            slots[pending] = (slots[pending] + np.uint64(1)) & mask
        return inserted


class Duplicates:
    """Pairs seen before in this stream: exact (the same two stripped sides) or normalized (the same after
    :func:`~transformer_mt.cleaning.rules.normalize_for_duplicates` on each side)."""

    def __init__(self, *, normalized: bool):
        self.normalized = normalized
        self.seen = SeenHashes()

    def repeated(self, srcs: Sequence[str], tgts: Sequence[str]) -> np.ndarray:
        """True for each pair that repeats one seen earlier (in an earlier call or earlier in this one)."""
        if self.normalized:
            srcs = [normalize_for_duplicates(s) for s in srcs]
            tgts = [normalize_for_duplicates(t) for t in tgts]
        hashes = np.fromiter((pair_hash(s, t) for s, t in zip(srcs, tgts)), dtype=np.uint64, count=len(srcs))
        return ~self.seen.add(hashes)
