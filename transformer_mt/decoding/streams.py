"""Translating chunks of lines as they come, through any :class:`~transformer_mt.decoding.results.TextTranslator`,
written in input order: one output line per input line, or with ``nbest`` > 1 ``INDEX<TAB>SCORE<TAB>TEXT``, K lines
per input line, INDEX 0-based, best first."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TextIO

from transformer_mt.decoding.results import TextTranslator, TranslateStats
from transformer_mt.decoding.sampling import Sampling


def write_results(results: list[list[tuple[float, str]]], out: TextIO, *, nbest: int, first_index: int) -> None:
    """One chunk's n-best lists: the best text per line, or every hypothesis numbered from ``first_index``."""
    for k, nb in enumerate(results):
        if nbest == 1:
            out.write(nb[0][1] + "\n")
        else:
            for score_, text in nb:
                out.write(f"{first_index + k}\t{score_:.4f}\t{text}\n")


def translate_stream(
    translator: TextTranslator,
    lines: Iterable[list[str]],
    out: TextIO,
    *,
    beam: int,
    lenpen: float,
    nbest: int = 1,
    batch_tokens: int | None = None,
    progress=None,
    sampling: Sampling | None = None,
) -> TranslateStats:
    """Translate chunks of lines as they come and write them in order; flushes after each chunk. Returns the
    stats of all chunks together (their ``warning()`` is the end-of-run truncation line). ``sampling``: samples
    instead of a search, each line's seeded by its number in the whole input (the chunks do not change them)."""
    index, total = 0, TranslateStats(max_src_tokens=translator.max_src_tokens)
    for chunk in lines:
        # one best per line is written as text alone: its score is not asked for
        results, stats = translator.translate_batch(
            chunk,
            beam=beam,
            lenpen=lenpen,
            nbest=nbest,
            batch_tokens=batch_tokens,
            scores=nbest > 1,
            sampling=None
            if sampling is None
            else dataclasses.replace(sampling, first_line=sampling.first_line + index),
        )
        write_results(results, out, nbest=nbest, first_index=index)
        out.flush()
        index += len(chunk)
        total += stats
        if progress is not None:
            progress.update(len(chunk))
    return total
