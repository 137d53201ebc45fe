"""Minimum Bayes risk (MBR) selection over pooled candidate translations.

Beam search returns the most probable output; the metric rewards the output with the most n-grams in
common with the reference. MBR decoding (Kumar & Byrne 2004; Eikema & Aziz 2020; Freitag et al. 2022)
picks, among the candidates of one input, the one with the highest expected utility when every
candidate in turn plays the reference:

    choice = argmax_h  sum_r  w(r) * U(h, r)

where ``w`` is a distribution over the pooled candidates and ``U`` is sentence-level BLEU. Pooling the
outputs of several systems (n-best lists, checkpoints, averages, length penalties) makes it a system
combination: the candidate the systems agree on most wins.

The candidates come as files that ``tmt translate`` writes: n-best files (``INDEX<TAB>SCORE<TAB>TEXT``,
``--nbest K``) or plain translation files (line i translates input line i). Every system gets the same
total weight; within a system, its candidates for an input share it uniformly (``weights="uniform"``) or
by the softmax of their scores over ``temperature`` (``weights="score"``; plain files have one candidate
per input, so it gets the whole weight). Identical strings are merged, their weights added.

The utility is sacreBLEU's sentence BLEU (13a tokenizer, exponential smoothing, effective order: the
numbers of ``sacrebleu.sentence_bleu``), computed from n-gram counts extracted once per candidate; the
clipped matches of a pair are symmetric, so each pair is counted once.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacrebleu.metrics.helpers import extract_all_word_ngrams
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from transformer_mt.errors import TmtError
from transformer_mt.text import iter_file

MAX_ORDER = 4  # BLEU's n-gram orders 1..4
WEIGHTS = ("uniform", "score")


class MbrError(TmtError, ValueError):
    """A candidate file or an option that MBR selection cannot use, worded for the user."""


@dataclass(frozen=True)
class Candidate:
    """One translation of one input, as read from a system's file."""

    text: str
    score: float  # the n-best file's score (logprob / length penalty); 0.0 for a plain translation file


def read_candidates(path: str | os.PathLike) -> list[list[Candidate]]:
    """The candidates of every input line in ``path``, in input order.

    An n-best file (every line ``INDEX<TAB>SCORE<TAB>TEXT``, INDEX 0-based and non-decreasing, starting at 0
    with no gap) gives each input its list; any other file is a plain translation file, one candidate
    per line. The format is decided by the first line.
    """
    if not Path(path).exists():  # not is_file: a pipe (the shell's <(...)) or a FIFO is read once, as it streams
        raise MbrError(f"{path}: file not found; give the output of tmt translate (plain, or --nbest K)")
    lines = [line.rstrip("\n") for line in iter_file(path)]
    if not lines or not _is_nbest(lines[0]):
        return [[Candidate(line.rstrip(), 0.0)] for line in lines]
    out: list[list[Candidate]] = []
    for number, line in enumerate(lines, start=1):
        parts = line.split("\t", 2)
        if not _is_nbest(line):
            raise MbrError(
                f"{path}:{number}: expected INDEX<TAB>SCORE<TAB>TEXT as on line 1 (an n-best file of tmt translate "
                f"--nbest K), got {line[:60]!r}; give whole n-best files, or plain translations throughout"
            )
        index, score = int(parts[0]), float(parts[1])
        if index == len(out):
            out.append([])
        elif index != len(out) - 1:
            raise MbrError(
                f"{path}:{number}: input index {index} follows {len(out) - 1}; an n-best file lists inputs "
                "0, 1, 2, ... in order with none missing, as tmt translate --nbest writes it"
            )
        out[-1].append(Candidate(parts[2].rstrip(), score))
    return out


def _is_nbest(line: str) -> bool:
    parts = line.split("\t", 2)
    # ASCII digits only: str.isdigit also accepts "²", which int() then refuses
    if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()):
        return False
    try:
        return math.isfinite(float(parts[1]))
    except ValueError:
        return False


def pool_weights(
    systems: Sequence[list[Candidate]], *, weights: str = "uniform", temperature: float = 1.0
) -> dict[str, float]:
    """The distribution over the distinct texts of one input's candidates from every system: each system
    weighs 1 / len(systems), shared among its candidates uniformly or by softmax(score / temperature)."""
    _check_options(weights, temperature)
    pool: dict[str, float] = {}  # insertion order = first appearance (system order, then rank): ties go to it
    for cands in systems:
        if weights == "uniform":
            shares = [1.0 / len(cands)] * len(cands)
        else:
            top = max(c.score for c in cands)
            exps = [math.exp((c.score - top) / temperature) for c in cands]
            shares = [e / sum(exps) for e in exps]
        for cand, share in zip(cands, shares):
            pool[cand.text] = pool.get(cand.text, 0.0) + share / len(systems)
    return pool


def _check_options(weights: str, temperature: float) -> None:
    if weights not in WEIGHTS:
        raise MbrError(f"weights={weights!r} is unknown; choose from {', '.join(WEIGHTS)}")
    if not temperature > 0:
        raise MbrError(
            f"temperature={temperature} must be > 0 (1 = the scores as they are; larger flattens the weights)"
        )


def sentence_bleu_from_stats(matches: Sequence[int], hyp_len: int, ref_len: int) -> float:
    """sacreBLEU's sentence BLEU (exp smoothing, effective order) from the clipped n-gram ``matches``
    (orders 1..4) of a hypothesis of ``hyp_len`` tokens against a reference of ``ref_len`` tokens,
    computed by sacreBLEU's own formula (``BLEU.compute_bleu``)."""
    totals = [max(0, hyp_len - n) for n in range(MAX_ORDER)]
    return BLEU.compute_bleu(list(matches), totals, hyp_len, ref_len, smooth_method="exp", effective_order=True).score


class _Ngrams:
    """A candidate's n-gram counts per order, extracted once."""

    def __init__(self, text: str, tokenizer: Tokenizer13a):
        counts, self.length = extract_all_word_ngrams(tokenizer(text), 1, MAX_ORDER)
        self.by_order: list[Counter] = [Counter() for _ in range(MAX_ORDER)]
        for gram, count in counts.items():
            self.by_order[len(gram) - 1][gram] = count


def mbr_choose(pool: dict[str, float], *, tokenizer: Tokenizer13a | None = None) -> tuple[str, float]:
    """The text of ``pool`` (text -> weight) with the highest expected sentence BLEU against the pool,
    and that expectation (0-100). Ties go to the text first in the pool."""
    texts = list(pool)
    tokenizer = tokenizer or Tokenizer13a()
    grams = [_Ngrams(t, tokenizer) for t in texts]
    weight = [pool[t] for t in texts]
    expected = [0.0] * len(texts)
    for i, gi in enumerate(grams):
        itself = sentence_bleu_from_stats([max(0, gi.length - n) for n in range(MAX_ORDER)], gi.length, gi.length)
        expected[i] += weight[i] * itself
        for j in range(i + 1, len(texts)):
            gj = grams[j]
            # clipped matches are symmetric: sum over shared n-grams of the smaller count
            matches = [sum((a & b).values()) for a, b in zip(gi.by_order, gj.by_order)]
            expected[i] += weight[j] * sentence_bleu_from_stats(matches, gi.length, gj.length)
            expected[j] += weight[i] * sentence_bleu_from_stats(matches, gj.length, gi.length)
    best = max(range(len(texts)), key=lambda k: (expected[k], -k))
    return texts[best], expected[best]


def mbr_files(paths: Sequence[str | os.PathLike], *, weights: str = "uniform", temperature: float = 1.0) -> list[str]:
    """One choice per input line from the candidate files ``paths`` (each one system's output for the same
    inputs), in input order. An input whose candidates are all empty gives an empty line."""
    if not paths:
        raise MbrError("give at least one candidate file (tmt translate output, plain or --nbest K)")
    _check_options(weights, temperature)  # before any file is read
    systems = [read_candidates(p) for p in paths]
    n = len(systems[0])
    for path, cands in zip(paths, systems):
        if len(cands) != n:
            raise MbrError(
                f"{path} has candidates for {len(cands)} inputs but {paths[0]} for {n}; "
                "every file must translate the same input lines"
            )
    tokenizer = Tokenizer13a()
    out = []
    for i in range(n):
        pool = pool_weights([s[i] for s in systems], weights=weights, temperature=temperature)
        out.append(mbr_choose(pool, tokenizer=tokenizer)[0])
    return out
