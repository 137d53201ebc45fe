"""`tmt clean`'s work: a pair of aligned files through a `PairFilter`, the kept pairs, the dropped ones and a report.

Both files are read by ``transformer_mt.text``'s strict readers, streamed in chunks; every output is written to a
temporary file renamed into place when the whole input has been read, so a failure (files of different lengths,
invalid UTF-8, a full disk) leaves earlier outputs as they were, and an output that is one of the inputs is refused.
The dropped pairs go to a TSV for review: a header, then ``rule, line, source, target`` per dropped pair (lines
numbered from 1), with backslash, tab and carriage return written as ``\\\\``, ``\\t`` and ``\\r``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.cleaning.errors import CleaningError
from transformer_mt.cleaning.pair_filter import KEEP, CleaningReport, PairFilter
from transformer_mt.config import FiltersConfig
from transformer_mt.text import count_lines, iter_file, safe_output

CHUNK_LINES = 10_000  # pairs checked at a time: memory stays bounded, langid and the hashes work per chunk
_END = object()  # the fill value past the end of the shorter file
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\r": "\\r"})


@dataclass(frozen=True)
class CleanOutputs:
    """Where ``tmt clean`` writes: the kept sources and targets, the dropped pairs (TSV) and the report (JSON)."""

    src: Path
    tgt: Path
    dropped: Path
    report: Path

    @classmethod
    def from_prefix(cls, prefix: str | os.PathLike, src_lang: str, tgt_lang: str) -> CleanOutputs:
        """PREFIX.<src_lang>, PREFIX.<tgt_lang>, PREFIX.dropped.tsv and PREFIX.report.json."""
        prefix = str(prefix)
        return cls(
            Path(f"{prefix}.{src_lang}"),
            Path(f"{prefix}.{tgt_lang}"),
            Path(f"{prefix}.dropped.tsv"),
            Path(f"{prefix}.report.json"),
        )


def clean_files(
    src: str | os.PathLike,
    tgt: str | os.PathLike,
    outputs: CleanOutputs,
    *,
    filters: FiltersConfig,
    src_lang: str,
    tgt_lang: str,
    chunk_lines: int = CHUNK_LINES,
) -> CleaningReport:
    """Filter the pairs of ``src`` / ``tgt`` (line i translates line i) by ``filters`` into ``outputs``.

    Kept pairs are written as they were read; the report (also written as JSON) counts pairs read, kept and
    dropped per rule. Raises :class:`CleaningError` for files of different lengths or outputs that collide, and
    ``transformer_mt.text``'s errors for a missing or unreadable input."""
    src, tgt = Path(src), Path(tgt)
    _check_outputs(outputs)
    pair_filter = PairFilter(filters, src_lang, tgt_lang)  # before reading: a missing extra fails at once
    _check_lengths(src, tgt)
    inputs = [src, tgt]
    with contextlib.ExitStack() as stack:
        out_src, out_tgt, dropped = (
            stack.enter_context(safe_output(p, inputs=inputs)) for p in (outputs.src, outputs.tgt, outputs.dropped)
        )
        dropped.write("rule\tline\tsource\ttarget\n")
        for lineno, sources, targets in _aligned_chunks(src, tgt, chunk_lines):
            for offset, verdict in enumerate(pair_filter.check(sources, targets)):
                if verdict == KEEP:
                    out_src.write(sources[offset] + "\n")
                    out_tgt.write(targets[offset] + "\n")
                else:
                    row = (verdict, str(lineno + offset), sources[offset], targets[offset])
                    dropped.write("\t".join(field.translate(_ESCAPES) for field in row) + "\n")
    report = pair_filter.report()
    with safe_output(outputs.report, inputs=inputs) as handle:
        json.dump(_report_json(report, src, tgt, outputs, pair_filter), handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    return report


def _check_outputs(outputs: CleanOutputs) -> None:
    paths = dataclasses.astuple(outputs)
    resolved = [os.path.realpath(p) for p in paths]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise CleaningError(
                f"{paths[i]}: two outputs are this one file; give each output its own path "
                "(--src-lang and --tgt-lang differ, or --out-src and --out-tgt)"
            )


def _check_lengths(src: Path, tgt: Path) -> None:
    """Files of different line counts are refused before any work when both can be counted (regular files); a
    pipe is checked as it streams (:func:`_aligned_chunks`)."""
    for path in (src, tgt):
        iter_file(path)  # checks the path at once (a missing file is named now), reads nothing
    if src.is_file() and tgt.is_file():
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise _length_error(src, tgt, n_src, n_tgt)


def _length_error(src: Path, tgt: Path, n_src: int | None, n_tgt: int | None) -> CleaningError:
    """Files of different lengths, one of them counted (``None``: the file goes on past the other's end)."""
    if n_tgt is None or (n_src is not None and n_src < n_tgt):
        shorter, n_short, longer, n_long = src, n_src, tgt, n_tgt
    else:
        shorter, n_short, longer, n_long = tgt, n_tgt, src, n_src
    more = f"has {n_long:,} lines" if n_long is not None else "goes on"
    return CleaningError(
        f"{shorter} ends after line {n_short:,} but {longer} {more}; line i of {src} must "
        f"translate line i of {tgt}, so give files of the same length"
    )


def _aligned_chunks(src: Path, tgt: Path, chunk_lines: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """(number of the chunk's first line, from 1; sources; targets) per ``chunk_lines`` pairs."""
    pairs = itertools.zip_longest(iter_file(src), iter_file(tgt), fillvalue=_END)
    lineno = 1
    while chunk := list(itertools.islice(pairs, chunk_lines)):
        for offset, (s, t) in enumerate(chunk):
            if s is _END or t is _END:
                both = lineno + offset - 1  # lines both files have
                raise _length_error(src, tgt, both if s is _END else None, both if t is _END else None)
        yield lineno, [s for s, _ in chunk], [t for _, t in chunk]  # type: ignore[misc]
        lineno += len(chunk)


def _report_json(report: CleaningReport, src: Path, tgt: Path, outputs: CleanOutputs, pair_filter: PairFilter) -> dict:
    return {
        "src": str(src),
        "tgt": str(tgt),
        "src_lang": pair_filter.src_lang,
        "tgt_lang": pair_filter.tgt_lang,
        "filters": dataclasses.asdict(pair_filter.filters),
        "rules": list(pair_filter.rules),
        **report.to_dict(),
        "outputs": {key: str(value) for key, value in dataclasses.asdict(outputs).items()},
    }
