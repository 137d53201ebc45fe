"""The ``ctranslate2`` phase (``--ctranslate2``, the ``export`` extra): tmt and CTranslate2 on one checkpoint.

Four rows on the same lines, beam, batch budget (``decode.batch_tokens`` source tokens) and length penalty 0 (the
only value whose meaning the two share):

- ``CTranslate2 float32`` / ``CTranslate2 int8``: the checkpoint converted by tmt and called as CTranslate2's users
  call it, one ``translate_batch`` over all the lines (``batch_type="tokens"``), with tmt's longest output for the
  longest line as ``max_decoding_length``; int8 weights are quantized at load. Timed: that call alone (the lines
  tokenized before, the outputs detokenized after, untimed);
- ``tmt --engine ctranslate2``: the same through tmt's engine, as ``tmt translate --engine ctranslate2`` uses it
  (tokenization, tmt's per-sentence output limits, detokenization, all timed);
- ``tmt``: tmt's own search (``Translator.translate_batch``), the reference of every "same output" share.

Per row: sentences/s and target tokens/s over all lines, the share of outputs identical to tmt's, and the
single-sentence latency (the median over the first 200 lines, one call per line). Each row runs in a process of
its own: the thread pools of one engine, once they have run, slow the next one in the same process. The rows run
``PASSES`` times, in turn (tmt, float32, int8, engine, tmt, ...), each time in a fresh process, and each figure is
the row's best pass, as the matmul peak is the best of its timings. On a shared machine a slow spell lasts from
seconds to minutes, and one process can run slow throughout: one pass per row, one row after the other, let such a
spell decide a ratio (the same CTranslate2 call read 5 ms a line in one process and 9 ms in the next).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

from transformer_mt.benchmark.phases import read_input
from transformer_mt.decoding import max_output_length

T = TypeVar("T")

LATENCY_SENTENCES = 200
PASSES = 3
ENGINE_ROW = "tmt --engine ctranslate2"


def _latency_ms(one: Callable[[int], object], n: int) -> float:
    """The median wall time of ``one(i)`` over the first ``n`` lines, in ms (after one untimed call)."""
    one(0)
    times = []
    for i in range(n):
        tic = time.perf_counter()
        one(i)
        times.append(time.perf_counter() - tic)
    return 1000 * statistics.median(times)


def _timed(call: Callable[[], T]) -> tuple[float, T]:
    tic = time.perf_counter()
    result = call()
    return time.perf_counter() - tic, result


def phase_ctranslate2(spec: dict) -> dict:
    """The four rows (module docstring) on ``spec``'s checkpoint, lines, beam and threads, each in a fresh process:
    CTranslate2's thread pools and torch's, once they have run, slow whatever runs next in the same process."""
    import ctranslate2  # the export extra: only this phase needs it

    from transformer_mt.export import ctranslate2_translator

    lines, beam, threads = read_input(spec), spec["beam"], spec["threads"]
    n_latency = min(LATENCY_SENTENCES, len(lines))
    # converted once, cached beside it
    engine = ctranslate2_translator([spec["checkpoint"]], device="cpu", threads=threads)
    d = engine.cfg.decode
    pieces = [p[: engine.max_src_tokens] for p in engine.src_tok.encode_pieces(lines)]  # tmt's truncation
    limits = [max_output_length(len(p) + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b) for p in pieces]
    options = dict(beam_size=beam, length_penalty=0.0, max_batch_size=d.batch_tokens, batch_type="tokens")
    jobs: dict[str, tuple[Callable[..., tuple[dict, list]], tuple]] = {
        "tmt": (_tmt_row, (spec["checkpoint"], lines, beam, threads, n_latency)),
        **{
            f"CTranslate2 {ct}": (
                _ctranslate2_row,
                (str(engine.model_dir), pieces, limits, options, ct, threads, n_latency),
            )
            for ct in ("float32", "int8")
        },
        ENGINE_ROW: (_engine_row, (spec["checkpoint"], lines, beam, threads, n_latency)),
    }
    passes: dict[str, list[dict]] = {name: [] for name in jobs}
    texts: dict[str, list] = {}
    for _ in range(spec.get("passes", PASSES)):
        for name, (row_fn, args) in jobs.items():
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                result: tuple[dict, list] = pool.apply(row_fn, args)
            row, out = result
            passes[name].append(row)
            texts.setdefault(name, out if name == "tmt" or name == ENGINE_ROW else engine.tgt_tok.decode_pieces(out))
    rows = {name: best_pass(runs) for name, runs in passes.items()}
    for name, row in rows.items():
        row["same_as_tmt"] = sum(a == b for a, b in zip(texts[name], texts["tmt"], strict=True)) / len(lines)
        row.update(sentences_per_s=len(lines) / row["seconds"], tokens_per_s=row["target_tokens"] / row["seconds"])
    return {
        "parameters": engine.num_parameters,
        "model_config": dataclasses.asdict(engine.cfg.model),
        "sentences": len(lines),
        "batch_tokens": d.batch_tokens,
        "latency_sentences": n_latency,
        "ctranslate2_version": ctranslate2.__version__,
        "engines": rows,
    }


def best_pass(runs: list[dict]) -> dict:
    """A row's best pass: the fastest whole call and the lowest one-line median (each pass's figures kept)."""
    best = dict(runs[0], seconds=min(r["seconds"] for r in runs), latency_p50_ms=min(r["latency_p50_ms"] for r in runs))
    best["passes"] = [{"seconds": r["seconds"], "latency_p50_ms": r["latency_p50_ms"]} for r in runs]
    return best


def _ctranslate2_row(
    model_dir: str, pieces: list, limits: list[int], options: dict, compute_type: str, threads: int, n_latency: int
) -> tuple[dict, list]:
    """CTranslate2 as its users call it: one translate_batch over all lines (timed alone); outputs as pieces."""
    import ctranslate2

    ct = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
    )
    ct.translate_batch(pieces[:8], max_decoding_length=max(limits[:8]), **options)  # warm-up
    seconds, out = _timed(lambda: ct.translate_batch(pieces, max_decoding_length=max(limits), **options))
    hyps = [r.hypotheses[0] for r in out]
    latency = _latency_ms(
        lambda i: ct.translate_batch([pieces[i]], max_decoding_length=limits[i], **options), n_latency
    )
    return _row(seconds, sum(len(h) + 1 for h in hyps), latency, dtype=compute_type), hyps  # + EOS, as tmt counts


def _engine_row(checkpoint: str, lines: list[str], beam: int, threads: int, n_latency: int) -> tuple[dict, list]:
    """tmt's engine as `tmt translate --engine ctranslate2` builds and calls it."""
    from transformer_mt.export import ctranslate2_translator

    engine = ctranslate2_translator([checkpoint], device="cpu", threads=threads)
    return _translator_row(engine, lines, beam, n_latency)


def _tmt_row(checkpoint: str, lines: list[str], beam: int, threads: int, n_latency: int) -> tuple[dict, list]:
    """tmt's own search, the reference of the same-output shares."""
    from transformer_mt.decoding import Translator

    return _translator_row(
        Translator.from_checkpoint(checkpoint, device="cpu", dtype="float32", threads=threads), lines, beam, n_latency
    )


def _translator_row(tr, lines: list[str], beam: int, n_latency: int) -> tuple[dict, list]:
    """As `tmt translate` calls it for one best per line: the text alone, no score asked for."""
    tr.translate_batch(lines[:8], beam=beam, lenpen=0.0, scores=False)  # warm-up
    seconds, result = _timed(lambda: tr.translate_batch(lines, beam=beam, lenpen=0.0, scores=False))
    latency = _latency_ms(lambda i: tr.translate_batch([lines[i]], beam=beam, lenpen=0.0, scores=False), n_latency)
    return _row(seconds, result.stats.tgt_tokens, latency, dtype="float32"), [nb[0][1] for nb in result.hypotheses]


def _row(seconds: float, target_tokens: int, latency_ms: float, *, dtype: str) -> dict:
    return {"seconds": seconds, "target_tokens": target_tokens, "latency_p50_ms": latency_ms, "dtype": dtype}
