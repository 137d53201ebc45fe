"""Duplicates across chunks: the hash table against Python's set, and a stream cut anywhere gives the same verdicts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from transformer_mt.cleaning import KEEP, PairFilter
from transformer_mt.cleaning.duplicates import SeenHashes, pair_hash
from transformer_mt.config import FiltersConfig


def reference_new(stream: list[list[int]]) -> list[list[bool]]:
    """Which hashes are new, chunk by chunk, by Python's set."""
    seen: set[int] = set()
    out = []
    for chunk in stream:
        flags = []
        for h in chunk:
            flags.append(h not in seen)
            seen.add(h)
        out.append(flags)
    return out


@pytest.mark.parametrize("spread", ["random", "one_slot"])
def test_seen_hashes_agrees_with_a_python_set(spread):
    rng = random.Random(7)
    if spread == "random":
        pool = [rng.getrandbits(64) or 1 for _ in range(300)]
    else:  # every hash in the same slot of any table up to 2^20: the longest probe chains, keys racing for slots
        pool = [(i + 1) << 20 for i in range(300)]
    stream = [[rng.choice(pool) for _ in range(rng.randint(0, 60))] for _ in range(40)]
    table = SeenHashes(capacity=2)  # grows many times on the way
    got = [table.add(np.array(chunk, dtype=np.uint64)).tolist() for chunk in stream]
    assert got == reference_new(stream)
    assert len(table) == len({h for chunk in stream for h in chunk})
    assert table.nbytes <= 8 * 4 * max(len(table), 1)  # at most 4 slots of 8 bytes per hash, growth included


def test_pair_hash_separates_the_sides():
    assert pair_hash("ab", "c") != pair_hash("a", "bc")
    assert pair_hash("a", "b") != pair_hash("b", "a")
    assert pair_hash("a", "b") == pair_hash("a", "b")


def corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n pairs drawn from 40 distinct ones, with case and digit variants: many duplicates far apart."""
    rng = random.Random(seed)
    srcs, tgts = [], []
    for _ in range(n):
        k = rng.randrange(40)
        digit = rng.choice("0123456789")
        srcs.append(f"{'The' if rng.random() < 0.5 else 'the'} cat {k} has {digit} toys.")
        tgts.append(f"Die Katze {k} hat {digit} Spielzeuge.")
    return srcs, tgts


@pytest.mark.parametrize("mode", ["exact", "normalized"])
def test_duplicates_are_found_across_chunk_boundaries(mode):
    srcs, tgts = corpus(500, seed=3)
    whole = PairFilter(FiltersConfig(duplicates=mode)).check(srcs, tgts)
    for size in (1, 7, 64):
        pair_filter = PairFilter(FiltersConfig(duplicates=mode))
        chunked = [
            v for i in range(0, len(srcs), size) for v in pair_filter.check(srcs[i : i + size], tgts[i : i + size])
        ]
        assert chunked == whole
    # independently: a pair is kept exactly when its key was not seen before
    if mode == "exact":
        keys = list(zip(srcs, tgts))
    else:  # the stated normalisation, on these ASCII lines: case folded, digit runs one digit, the stop a space

        def plain(side: str) -> str:
            return " ".join("0" if word.isdigit() else word for word in side.lower().replace(".", " ").split())

        keys = [(plain(s), plain(t)) for s, t in zip(srcs, tgts)]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    assert whole == [KEEP if first[key] == i else f"{mode}_duplicate" for i, key in enumerate(keys)]
