"""The ``ctranslate2`` phase (``--ctranslate2``, the ``export`` extra): tmt and CTranslate2 on one checkpoint.

The checkpoint is exported by ``tmt export`` and decoded by CTranslate2 with float32 and int8 weights (int8
quantized at load), against tmt on the same lines in the same process, at the same batch size
(``decode.batch_tokens`` source tokens) and length penalty 0 on both sides (the only value whose meaning the
two share). CTranslate2 takes one maximum output length per call where tmt's is floor(a * n + b) per
sentence, so the lines are decoded in one call per source length n: the two engines then do the same work,
and with float32 weights give the same output.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from benchmarking.phases import read_input
from transformer_mt.decoding import Translator, max_output_length
from transformer_mt.model import count_parameters


def phase_ctranslate2(spec: dict) -> dict:
    """tmt, then CTranslate2 (float32 and int8 weights) on the same lines, beam, batch size and length penalty 0."""
    import ctranslate2  # the export extra: only this phase needs it

    from transformer_mt.export import export

    translator = Translator.from_checkpoint(spec["checkpoint"], device="cpu", dtype="float32", threads=spec["threads"])
    lines = read_input(spec)
    d, beam = translator.cfg.decode, spec["beam"]
    translator.translate_batch(lines[:8], beam=beam, lenpen=0.0)  # warm-up
    tic = time.perf_counter()
    result = translator.translate_batch(lines, beam=beam, lenpen=0.0)
    seconds = time.perf_counter() - tic
    ours = [nb[0][1] for nb in result.hypotheses]
    rows = {"tmt": {"seconds": seconds, "target_tokens": result.stats.tgt_tokens, "same_as_tmt": 1.0}}
    model_dir = export(spec["checkpoint"], Path(spec["result"]).with_suffix(".ct2"), force=True)
    pieces = [p[: translator.max_src_tokens] for p in translator.src_tok.encode_pieces(lines)]  # tmt's truncation
    by_length: dict[int, list[int]] = {}  # source length n -> its lines (empty lines are not decoded, as in tmt)
    for i, p in enumerate(pieces):
        if lines[i].strip():
            by_length.setdefault(len(p), []).append(i)
    options = dict(beam_size=beam, length_penalty=0.0, max_batch_size=d.batch_tokens, batch_type="tokens")

    def decode(ct) -> list[list[str]]:
        hyps: list[list[str]] = [[] for _ in lines]
        for n, idx in by_length.items():  # one call per source length: tmt's maximum output for n pieces + EOS
            longest = max_output_length(n + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
            out = ct.translate_batch([pieces[i] for i in idx], max_decoding_length=longest, **options)
            for i, r in zip(idx, out, strict=True):
                hyps[i] = r.hypotheses[0]
        return hyps

    for compute_type in ("float32", "int8"):
        ct = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type, intra_threads=spec["threads"], inter_threads=1)
        ct.translate_batch(pieces[:8], **options)  # warm-up
        tic = time.perf_counter()
        hyps = decode(ct)
        seconds = time.perf_counter() - tic
        texts = translator.tgt_tok.decode_pieces(hyps)
        rows[compute_type] = {
            "seconds": seconds,
            "target_tokens": sum(len(h) + 1 for h, line in zip(hyps, lines, strict=True) if line.strip()),  # + EOS, as tmt
            "same_as_tmt": sum(a == b for a, b in zip(texts, ours, strict=True)) / len(lines),
        }
    for row in rows.values():
        row.update(sentences_per_s=len(lines) / row["seconds"], tokens_per_s=row["target_tokens"] / row["seconds"])
    return {
        "parameters": count_parameters(translator.model),
        "model_config": dataclasses.asdict(translator.cfg.model),
        "sentences": len(lines),
        "batch_tokens": d.batch_tokens,
        "calls": len(by_length),
        "ctranslate2_version": ctranslate2.__version__,
        "engines": rows,
    }
