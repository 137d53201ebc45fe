"""The lines a sentencepiece model is trained on: every line of its files once, or, over more than two languages,
so many lines of each language that a small language keeps its pieces.

A joint vocabulary learnt from the raw concatenation of a multilingual corpus is mostly the large languages' pieces:
a language with a hundredth of the lines gets a hundredth of the counts, and its words fall apart into characters.
Over more than two languages the lines are therefore sampled per language with a temperature (Conneau and Lample,
2019, sample the sentences their BPE codes are learnt on this way; Arivazhagan et al., 2019, flatten the data of
their massively multilingual model with T = 5):

    q_l = n_l ** (1 / T) / sum_j n_j ** (1 / T),    k_l = max(1, round(B * q_l)),    T = TEMPERATURE = 5

where n_l is the non-empty lines of language l (all its files together, each file read once), B the lines fed in all,
Σ n_l capped at sentencepiece's ``input_sentence_size`` (so sentencepiece, which samples above that size, keeps them
all), and k_l the lines of language l fed: a language with more lines than k_l gives a seeded random k_l of them,
one with fewer gives every line k_l // n_l times and a seeded random k_l mod n_l once more. Since
n_l ** (1/T) >= (n_l / n_max) ** (1/T) * n_max ** (1/T), every one of L languages gets at least
(n_l / n_max) ** (1/T) / L of the input: a language with a hundredth of the largest's lines still gets
0.01 ** 0.2 / L ~ 40% / L, where its raw share would be under 1% / L.

One or two languages (a language pair: its two sides are parallel, so equally large) are read as they always were:
every line once, file by file, in order. Inputs whose language is not stated count as one language.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping, Sequence

from transformer_mt.text.textio import TextError, iter_file

TEMPERATURE = 5.0  # the flattening of the per-language sampling above
SEED = 0  # the sampling's seed: the same files give the same tokenizer


def nonempty_lines(paths: Sequence[str | os.PathLike]) -> Iterator[str]:
    """Stripped non-empty lines, read as training reads them (textio: invalid UTF-8 is an error naming the line)."""
    for path in paths:
        for line in iter_file(path):
            line = line.strip()
            if line:
                yield line


def language_shares(counts: Mapping[str, int], *, temperature: float = TEMPERATURE) -> dict[str, float]:
    """q_l = n_l ** (1/T) / sum_j n_j ** (1/T) over the languages with lines (a language with none gets 0)."""
    weights = {lang: n ** (1.0 / temperature) if n > 0 else 0.0 for lang, n in counts.items()}
    total = sum(weights.values())
    return {lang: (w / total if total else 0.0) for lang, w in weights.items()}


def lines_per_language(
    counts: Mapping[str, int], *, input_sentence_size: int, temperature: float = TEMPERATURE
) -> dict[str, int]:
    """k_l = max(1, round(B * q_l)) lines of each language with lines, B = sum of n_l capped at
    ``input_sentence_size`` (0: no cap)."""
    total = sum(counts.values())
    budget = min(total, input_sentence_size) if input_sentence_size > 0 else total
    shares = language_shares(counts, temperature=temperature)
    return {lang: (max(1, round(budget * shares[lang])) if n > 0 else 0) for lang, n in counts.items()}


def sentencepiece_lines(
    inputs: Sequence[str | os.PathLike], languages: Sequence[str] = (), *, input_sentence_size: int
) -> Iterator[str]:
    """The lines to train on: every non-empty line of ``inputs`` once, in order, unless ``languages`` (one code per
    input, "" where not stated) names more than two languages; then k_l lines of each language (module docstring).
    A file given twice for one language is read once."""
    groups = _groups(inputs, languages)
    if len(groups) <= 2:
        yield from nonempty_lines(inputs)
        return
    counts = {lang: sum(1 for _ in nonempty_lines(paths)) for lang, paths in groups.items()}
    wanted = lines_per_language(counts, input_sentence_size=input_sentence_size)
    for index, (lang, paths) in enumerate(groups.items()):
        yield from _sampled(paths, counts[lang], wanted[lang], random.Random(SEED + index))


def _groups(inputs: Sequence[str | os.PathLike], languages: Sequence[str]) -> dict[str, list[str | os.PathLike]]:
    """The inputs by language, in first-seen order, each file once per language."""
    if languages and len(languages) != len(inputs):
        raise ValueError(f"{len(languages)} languages for {len(inputs)} inputs: give one language per input")
    groups: dict[str, list[str | os.PathLike]] = {}
    for path, lang in zip(inputs, languages or [""] * len(inputs)):
        paths = groups.setdefault(lang, [])
        if os.path.realpath(path) not in {os.path.realpath(p) for p in paths}:
            paths.append(path)
    return groups


def _sampled(paths: Sequence[str | os.PathLike], n: int, k: int, rng: random.Random) -> Iterator[str]:
    """``k`` of the ``n`` non-empty lines of ``paths``: every line k // n times, then a random k mod n of them once."""
    if n == 0:
        return
    passes, extra = divmod(k, n)
    for _ in range(passes):
        yield from nonempty_lines(paths)
    chosen = sorted(rng.sample(range(n), extra))
    if not chosen:
        return
    pick = iter(chosen)
    want = next(pick)
    for i, line in enumerate(nonempty_lines(paths)):
        if i == want:
            yield line
            want = next(pick, -1)
            if want < 0:
                return


class ReadErrorKept:
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
