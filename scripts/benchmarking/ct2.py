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
single-sentence latency (the median over the first 200 lines, one call per line). The CTranslate2 rows run first
and tmt's last: torch's OpenMP threads, once they have run, slow the CTranslate2 calls of the same process.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from benchmarking.phases import read_input
from transformer_mt.decoding import Translator, max_output_length

LATENCY_SENTENCES = 200
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


def phase_ctranslate2(spec: dict) -> dict:
    """The four rows (module docstring) on ``spec``'s checkpoint, lines, beam and threads."""
    import ctranslate2  # the export extra: only this phase needs it

    from transformer_mt.export import ctranslate2_translator

    lines, beam, threads = read_input(spec), spec["beam"], spec["threads"]
    n_latency = min(LATENCY_SENTENCES, len(lines))
    engine = ctranslate2_translator([spec["checkpoint"]], device="cpu", threads=threads)  # converted once, cached beside it
    d, tok = engine.cfg.decode, engine.src_tok
    pieces = [p[: engine.max_src_tokens] for p in tok.encode_pieces(lines)]  # tmt's truncation
    limits = [max_output_length(len(p) + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b) for p in pieces]
    options = dict(beam_size=beam, length_penalty=0.0, max_batch_size=d.batch_tokens, batch_type="tokens")
    rows: dict[str, dict] = {}
    texts: dict[str, list[str]] = {}
    for compute_type in ("float32", "int8"):
        ct = ctranslate2.Translator(str(engine.model_dir), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1)
        ct.translate_batch(pieces[:8], max_decoding_length=max(limits[:8]), **options)  # warm-up
        tic = time.perf_counter()
        out = ct.translate_batch(pieces, max_decoding_length=max(limits), **options)
        seconds = time.perf_counter() - tic
        hyps = [r.hypotheses[0] for r in out]
        texts[compute_type] = engine.tgt_tok.decode_pieces(hyps)
        latency = _latency_ms(lambda i, ct=ct: ct.translate_batch([pieces[i]], max_decoding_length=limits[i], **options), n_latency)
        rows[f"CTranslate2 {compute_type}"] = _row(seconds, sum(len(h) + 1 for h in hyps), latency, dtype=compute_type)  # + EOS, as tmt
    engine.translate_batch(lines[:8], beam=beam, lenpen=0.0)  # warm-up
    result = engine.translate_batch(lines, beam=beam, lenpen=0.0)
    texts[ENGINE_ROW] = [nb[0][1] for nb in result.hypotheses]
    latency = _latency_ms(lambda i: engine.translate_batch([lines[i]], beam=beam, lenpen=0.0), n_latency)
    rows[ENGINE_ROW] = _row(result.stats.seconds, result.stats.tgt_tokens, latency, dtype="float32")

    translator = Translator.from_checkpoint(spec["checkpoint"], device="cpu", dtype="float32", threads=threads)
    translator.translate_batch(lines[:8], beam=beam, lenpen=0.0)  # warm-up
    result = translator.translate_batch(lines, beam=beam, lenpen=0.0)
    ours = [nb[0][1] for nb in result.hypotheses]
    latency = _latency_ms(lambda i: translator.translate_batch([lines[i]], beam=beam, lenpen=0.0), n_latency)
    rows = {"tmt": _row(result.stats.seconds, result.stats.tgt_tokens, latency, dtype="float32"), **rows}
    texts["tmt"] = ours
    for name, row in rows.items():
        key = name.removeprefix("CTranslate2 ")
        row["same_as_tmt"] = sum(a == b for a, b in zip(texts[key], ours, strict=True)) / len(lines)
        row.update(sentences_per_s=len(lines) / row["seconds"], tokens_per_s=row["target_tokens"] / row["seconds"])
    return {
        "parameters": translator.num_parameters,
        "model_config": dataclasses.asdict(translator.cfg.model),
        "sentences": len(lines),
        "batch_tokens": d.batch_tokens,
        "latency_sentences": n_latency,
        "ctranslate2_version": ctranslate2.__version__,
        "engines": rows,
    }


def _row(seconds: float, target_tokens: int, latency_ms: float, *, dtype: str) -> dict:
    return {"seconds": seconds, "target_tokens": target_tokens, "latency_p50_ms": latency_ms, "dtype": dtype}
