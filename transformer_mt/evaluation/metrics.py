"""Corpus BLEU, chrF and TER through sacreBLEU's library, with signatures and line-count checks.

Scores equal those of sacreBLEU's own command line on the same files: lines are read as the
CLI reads them (UTF-8, split on "\\n" only, trailing whitespace removed; unlike it, a byte-order
mark at the start of a file is removed, as every tmt reader does, not scored as part of the first
word), the metric objects are sacreBLEU's ``BLEU`` / ``CHRF`` / ``TER`` with their defaults, and
:func:`format_text` / :func:`format_json` print what ``sacrebleu REF -i HYP -m ... --format
text|json`` prints.
Always report the signature with a score (Post, 2018, "A Call for Clarity in Reporting BLEU").

``lowercase=True`` makes BLEU and chrF case-insensitive (the CLI's ``-lc --chrf-lowercase``);
TER keeps sacreBLEU's default, which is already case-insensitive (TERCOM's behaviour).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from transformer_mt.errors import TmtError
from transformer_mt.text import iter_file, iter_stream

METRICS = ("bleu", "chrf", "ter")


class MetricsError(TmtError, ValueError):
    """A scoring problem worded for the user (names the file or the counts, and the fix)."""


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (``"-"``: stdin) with trailing whitespace (and the newline) removed.

    Read by :mod:`transformer_mt.text.textio`'s rules, as every tmt reader: only "\\n" ends a line, as in
    sacreBLEU's CLI (a stray "\\r" or U+2028 inside a sentence does not split it), invalid UTF-8 is
    an error naming the line, a byte-order mark is removed. Empty lines are kept, so line i is
    always sentence i.
    """
    if str(path) == "-":
        return [line.rstrip() for line in iter_stream()]
    if not Path(path).exists():  # not is_file: a pipe (the shell's <(...)) or a FIFO is read as it streams
        raise MetricsError(f"{path}: file not found; check the path")
    return [line.rstrip() for line in iter_file(path)]


def score(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    *,
    metrics: Sequence[str] = ("bleu", "chrf"),
    lowercase: bool = False,
    tokenize: str | None = None,
    ter: bool = False,
    hyp_name: str | None = None,
    ref_names: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Corpus-level scores of ``hyps`` against one or more reference streams.

    ``refs`` is a list of reference *streams*, as in sacreBLEU: ``refs[k][i]`` is the k-th
    reference of sentence i, and every stream has ``len(hyps)`` lines. ``tokenize`` is BLEU's
    tokenizer (None = sacreBLEU's default, 13a); ``ter=True`` adds TER to ``metrics``.
    ``hyp_name`` / ``ref_names`` (file names) only make error messages clearer.

    Returns ``{metric: {"name", "score", "signature", "verbose", "text"}}`` in the order asked:
    ``score`` is the unrounded float, ``signature`` e.g. ``nrefs:1|case:mixed|...|version:2.6.0``,
    ``verbose`` BLEU's n-gram precisions and brevity penalty ("" for chrF and TER), and ``text``
    the line sacreBLEU's CLI prints (one decimal).
    """
    names = _metric_names(metrics, ter)
    hyps, refs = list(hyps), [list(stream) for stream in _check_refs(refs)]
    _check_counts(hyps, refs, hyp_name, ref_names)
    if not hyps:
        raise MetricsError(f"{hyp_name or 'hypotheses'}: no lines to score; give a non-empty file")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        metric = _make_metric(name, lowercase=lowercase, tokenize=tokenize)
        result = metric.corpus_score(hyps, refs)
        signature = metric.get_signature().format()
        verbose = getattr(result, "_verbose", "") or ""  # sacreBLEU keeps BLEU's details here
        results[name] = {"name": result.name, "score": float(result.score), "signature": signature, "verbose": verbose}
        results[name]["text"] = _line(results[name], width=1)
    return results


def score_files(
    hyp_path: str | os.PathLike, ref_paths: Sequence[str | os.PathLike], **kwargs: Any
) -> dict[str, dict[str, Any]]:
    """:func:`score` on files: one hypothesis file and one file per reference."""
    if not ref_paths:
        raise MetricsError("no reference file given; pass at least one")
    return score(
        read_lines(hyp_path),
        [read_lines(p) for p in ref_paths],
        hyp_name=str(hyp_path),
        ref_names=[str(p) for p in ref_paths],
        **kwargs,
    )


def _metric_names(metrics: Sequence[str], ter: bool) -> list[str]:
    if isinstance(metrics, str):
        metrics = [metrics]
    names: list[str] = []
    for name in [*metrics, *(["ter"] if ter else [])]:
        key = name.lower()
        if key not in METRICS:
            raise MetricsError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
        if key not in names:
            names.append(key)
    if not names:
        raise MetricsError(f"no metric asked for; choose from {', '.join(METRICS)}")
    return names


def _check_refs(refs: Sequence[Sequence[str]]) -> Sequence[Sequence[str]]:
    if isinstance(refs, str) or not refs:
        raise MetricsError("refs must be a non-empty list of reference streams, e.g. [ref_lines]")
    if any(isinstance(stream, str) for stream in refs):
        raise MetricsError(
            "refs must be a list of reference streams (lists of lines); wrap a single reference as [ref_lines]"
        )
    return refs


def _check_counts(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], hyp_name: str | None, ref_names: Sequence[str] | None
) -> None:
    for k, stream in enumerate(refs):
        if len(stream) != len(hyps):
            hyp = f"{hyp_name} has" if hyp_name else "the hypotheses have"
            ref = f"{ref_names[k]} has" if ref_names and k < len(ref_names) else f"reference {k + 1} has"
            raise MetricsError(
                f"{hyp} {len(hyps)} lines but {ref} {len(stream)}; line i of the hypotheses must translate "
                "line i of each reference (empty lines included)"
            )


def _make_metric(name: str, *, lowercase: bool, tokenize: str | None) -> BLEU | CHRF | TER:
    if name == "bleu":
        if tokenize is not None and tokenize not in BLEU.TOKENIZERS:
            raise MetricsError(f"BLEU tokenizer {tokenize!r} is unknown; choose from {', '.join(BLEU.TOKENIZERS)}")
        try:
            # tokenize="none" declares the text tokenized already: sacreBLEU's "forgot to detokenize?"
            # warning (its force flag) would only be noise then; the score is the same either way
            return BLEU(lowercase=lowercase, tokenize=tokenize, force=tokenize == "none")
        except (ImportError, RuntimeError) as exc:  # ja-mecab, ko-mecab, spm need extra packages or downloads
            raise MetricsError(
                f"BLEU tokenizer {tokenize!r} is unavailable ({exc}); install its extra or use tokenize=13a"
            ) from None
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    return TER()


# ----------------------------------------------------------------------------- formatting


def _line(result: dict[str, Any], *, width: int) -> str:
    """sacreBLEU's ``Score.format`` for one metric: ``NAME|signature = score verbose``."""
    line = f"{result['name']}|{result['signature']} = {result['score']:.{width}f}"
    return f"{line} {result['verbose']}" if result["verbose"] else line


def format_text(results: dict[str, dict[str, Any]], *, width: int = 1, score_only: bool = False) -> str:
    """For humans, as ``sacrebleu --format text`` prints it: one line per metric, aligned on " = "."""
    if score_only:
        return "\n".join(f"{r['score']:.{width}f}" for r in results.values())
    lines = [_line(r, width=width) for r in results.values()]
    if len(lines) == 1:
        return lines[0]
    # Right-align everything left of "=" as sacrebleu.utils.print_single_results does.
    cut = [line.index("=") - 1 for line in lines]
    w = max(cut)
    return "\n".join(f"{line[:c]:>{w}}{line[c:]}" for c, line in zip(cut, lines))


def format_json(results: dict[str, dict[str, Any]], *, width: int = 1) -> str:
    """For machines, as ``sacrebleu --format json`` prints it (a list when several metrics).

    Each object has ``name``, ``score`` (rounded to ``width`` decimals), ``signature``,
    ``verbose_score`` (BLEU only) and the signature's fields as separate string keys.
    """
    objects = []
    for r in results.values():
        d: dict[str, Any] = {"name": r["name"], "score": float(f"{r['score']:.{width}f}"), "signature": r["signature"]}
        if r["verbose"]:
            d["verbose_score"] = r["verbose"]
        for field in r["signature"].split("|"):
            key, value = field.split(":", 1)
            d[key] = value
        objects.append(json.dumps(d, indent=1, ensure_ascii=False))
    return objects[0] if len(objects) == 1 else "[\n" + ",\n".join(objects) + "\n]"
