#!/usr/bin/env python
"""Benchmark transformer_mt on this machine (issue 6); writes <out>/benchmark.json and <out>/benchmark.md.

    python scripts/benchmark.py [--config configs/multi30k_en_de.yaml] [--data DIR] [--out bench]
                                [--threads 2] [--warmup 5] [--updates 40] [--sentences 0]
                                [--checkpoint CKPT] [--reference-checkpoint CKPT] [--ctranslate2] [--quick]
                                [--peer fairseq [--fairseq-env DIR] [--peer-updates 40 160] [--only peer]]

Each phase runs in a fresh subprocess of this script (``--phase SPEC.json``), so the ``ru_maxrss``
it reports is that phase's own peak resident memory (the Python interpreter and torch included):
  matmul     an n x n matmul in float32 and bfloat16: after 3 warm-up runs, the best of ``reps`` timed
             runs, GFLOP/s = 2 n^3 / seconds, at the start and again at the end of the run; the faster
             of the two is the machine's peak;
  train      ``tmt train``'s own loop (:class:`transformer_mt.training.trainer.Trainer`, fed through its
             ``on_update`` hook) on real Multi30k token-budget batches, for the recipe model (--config)
             and the reference model (3+3 layers, d_model 256, d_ff 1024, 4 heads, post-norm, shared
             embeddings, 4096-token batches), each in float32 and bfloat16 autocast: ``--warmup`` updates
             untimed, then ``--updates`` timed; tokens/s counts non-pad target tokens (pieces + EOS).
             Both models also train once more in float32 with "plain ops" (``F.dropout`` and the unfused
             logits + ``label_smoothed_nll_loss`` path, switched on by ``kernels.use_reference_ops``), the
             baseline of the CPU speed-ups, same batches;
  translate  :class:`transformer_mt.decoding.translator.Translator` on test_2016_flickr.en, greedy and beam 5, at
             the checkpoint's ``decode.batch_tokens`` and ``decode.lenpen``, after an untimed warm-up on 8
             sentences; tokens/s counts generated tokens + EOS. Two models: the reference size
             (``--reference-checkpoint``, a trained 3+3/d256 model; the beam-5 speed compared with
             fairseq's is this one's) and the recipe model (``--checkpoint``, timed only when given).
             Without ``--reference-checkpoint`` the reference model is the one after the benchmark's few
             float32 updates: its outputs are too long and the speed is flagged ``"representative": false``.
  syncs      host-device synchronisations (:class:`transformer_mt.runtime.syncs.SyncCounter`, which counts on
             any device the ops that make a GPU's host wait): per training update of the recipe model in
             float32 (3 updates, on the phase's own fresh Trainer) and per search step of its (untrained)
             model, greedy and beam 5, at batches of 8 and 32 test sentences. The budgets (issue 21): one
             per training update, one per search step whatever the batch size and beam;
  ctranslate2  with ``--ctranslate2`` (the ``export`` extra), after the others: each translated checkpoint
             exported by ``tmt export`` and decoded by CTranslate2 with float32 and int8 weights (int8
             quantized at load), greedy and beam 5, against tmt on the same lines in the same process at
             the same batch size (``decode.batch_tokens`` source tokens) and length penalty 0 on both
             sides (the only value whose meaning the two share). CTranslate2 takes one maximum output
             length per call where tmt's is floor(a * n + b) per sentence, so the lines are decoded in one
             call per source length n: the two engines then do the same work, and with float32 weights give
             the same output. Reports tokens/s, sentences/s and the share of lines whose output equals tmt's.
  peer       with ``--peer fairseq`` (issue 22): tmt's train phase and then ``fairseq-train --cpu`` (in the side environment
             scripts/fairseq_env.sh makes) on one config and the same pairs, timed over the same updates; ``--only peer``
             runs just these and the matmul peak. How the two are made equal and timed: scripts/fairseq_peer.py.

FLOPs per target token (multiply-add = 2 FLOPs), counted two ways on the padded batches actually run:
  measured   torch.utils.flop_counter.FlopCounterMode over forward, loss and backward of the first timed
             batches; torch has no formula for the CPU flash-attention kernels SDPA uses here, so they are
             counted as it counts the CUDA ones (forward Q K^T and A V; backward recomputes Q K^T and does
             4 more matmuls). The achieved GFLOP/s and the fraction of the matmul peak use this count.
  analytic   3 x forward (backward = 2 x forward) over all timed batches, by transformer_mt.runtime.flops.train_flops
             (the formula is in that module's docstring; the training cost report of `tmt train` uses it too).

The reference figures (fairseq, OpenNMT-py, the issue's matmul peaks) are quoted from issue 6 and were
measured elsewhere; this script measures none of them (``--peer fairseq`` measures fairseq itself, in its own table).
No number here is meaningful on a busy machine: the load average at start and end is recorded to show it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from transformer_mt.config import Config, DecodeConfig, ModelConfig, TrainConfig, from_dict, load_config, to_dict
from transformer_mt.data import load_parallel, source_tensor
from transformer_mt.decoding import Translator, beam_search, greedy_search, positions_needed
from transformer_mt.model import count_parameters, kernels, label_smoothed_nll_loss
from transformer_mt.runtime import (
    SyncCounter,
    forward_flops,  # the analytic formula of the docstring, shared with tmt train's cost report
    per_call,
)
from transformer_mt.runtime import device as runtime
from transformer_mt.text import PAD_ID, Tokenizer, train_sentencepiece
from transformer_mt.training import Trainer, target_tokens, update_schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts/fairseq_peer.py, also when tests load this file by path
import fairseq_peer  # noqa: E402, I001  (--peer fairseq)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "transformer_mt.benchmark/1"
RECIPE_CONFIG, FALLBACK_CONFIG = REPO / "configs" / "multi30k_en_de.yaml", REPO / "configs" / "multi30k_small.yaml"
REFERENCE_MODEL = dict(encoder_layers=3, decoder_layers=3, d_model=256, heads=4, d_ff=1024, dropout=0.1, norm="post", share_all_embeddings=True)
# The reference model's vocabulary: a joint unigram model of 8,000 pieces whatever the recipe uses, so its
# output layer (a large share of a small model's FLOPs) stays the same from one recipe to the next.
REFERENCE_VOCAB = 8000
# The reference model's optimiser: multi30k_small.yaml's schedule, so the few benchmark updates move the weights.
REFERENCE_TRAIN = dict(max_tokens=4096, update_freq=1, label_smoothing=0.1, lr_schedule="inverse_sqrt", lr=1e-3, warmup_updates=400)
QUOTED = {  # issue 6, measured elsewhere: never by this script
    "source": "quoted from issue 6, measured elsewhere; not measured by this script",
    "setting": "3+3 layers, d_model 256, d_ff 1024, 4 heads, post-norm, shared embeddings, float32, 2 threads, 4096-token batches",
    "train_tokens_per_s": {"fairseq 0.12.2": 1570, "OpenNMT-py 3.5.1": 1200},
    "beam5_sentences_per_s": {"fairseq-generate": 20, "OpenNMT-py": "30-39"},
    "matmul_peak_gflops": {"float32": 134, "bfloat16": 376},
    "targets": {"train_tokens_per_s": "1.5 x 1,570 (fairseq, the faster)", "beam5_sentences_per_s": "3 x 20 (fairseq)"},
}
TRAIN_QUOTED, TRAIN_TARGET, BEAM5_QUOTED, BEAM5_TARGET = 1570.0, 1.5, 20.0, 3.0
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What a full run and a --quick run (seconds, tiny models, same schema) measure."""

    warmup: int = 5  # untimed updates per training run (--warmup)
    updates: int = 40  # timed updates per training run (--updates)
    matmul_n: int = 2048  # side of the square matmul timed for the peak
    matmul_reps: int = 10  # timed matmuls per dtype (the best one is the peak)
    sentences: int = 0  # test sentences translated (--sentences); 0 = all
    flop_batches: int = 3  # timed batches run again under FlopCounterMode
    train_lines: int = 0  # training pairs used; 0 = all (spm and the batches see only these)
    spm_vocab: int = 0  # sentencepiece vocabulary; 0 = the recipe's tokenizer.vocab_size
    model: tuple = ()  # model.* overrides for both models (quick: tiny)
    max_tokens: int = 0  # batch budget for both models; 0 = recipe's / 4096


FULL = Sizes()
QUICK = Sizes(
    warmup=1,
    updates=2,
    matmul_n=256,
    matmul_reps=3,
    sentences=20,
    flop_batches=1,
    train_lines=2000,
    spm_vocab=1000,
    model=(("encoder_layers", 1), ("decoder_layers", 1), ("d_model", 32), ("heads", 2), ("d_ff", 64)),
    max_tokens=512,
)
# --device cuda: more updates (a GPU update takes milliseconds), the GPU's matmul size, FLOPs by the formula only.
FULL_CUDA = dataclasses.replace(FULL, warmup=10, updates=50, matmul_n=8192, flop_batches=0)
QUICK_CUDA = dataclasses.replace(QUICK, flop_batches=0)
GPU_BATCH_TOKENS = 25000  # the paper's ~25k source + 25k target tokens per update, in one batch (section 5.1)
# Dense (no sparsity) bfloat16 tensor-core peaks in TFLOP/s from NVIDIA's datasheets, the denominator of MFU:
# quoted, not measured. The first pattern in torch.cuda.get_device_name() wins (specific names first);
# an unlisted GPU gets its measured bfloat16 matmul peak instead (or --peak-tflops).
GPU_BF16_PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.5),
    ("H200 NVL", 835.5),
    ("H100", 989.5),
    ("H200", 989.5),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


# ---------------------------------------------------------------- FLOP counting
def cpu_sdpa_formulas() -> dict:
    """FlopCounterMode formulas for the CPU flash-attention kernels, borrowed from the CUDA kernels'."""
    aten = torch.ops.aten
    # FlopCounterMode passes the op's other arguments and out_shape too; the count needs only the shapes of q, k, v (and g).
    fwd = lambda q, k, v, *_args, **_kwargs: sdpa_flop_count(q, k, v)  # noqa: E731
    bwd = lambda g, q, k, v, *_args, **_kwargs: sdpa_backward_flop_count(g, q, k, v)  # noqa: E731
    names = {"_scaled_dot_product_flash_attention_for_cpu": fwd, "_scaled_dot_product_flash_attention_for_cpu_backward": bwd}
    return {getattr(aten, name): fn for name, fn in names.items() if hasattr(aten, name)}


def count_flops(fn) -> int:
    """FLOPs that FlopCounterMode sees while ``fn()`` runs."""
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa_formulas()) as counter:
        fn()
    return counter.get_total_flops()


def train_step_flops(model, batch, *, dtype: str, epsilon: float) -> int:
    """Measured FLOPs of forward, label-smoothed loss and backward on one batch; gradients are dropped."""

    def step() -> None:
        with runtime.autocast(torch.device("cpu"), dtype):
            logits = model(batch.src, batch.tgt_in)
        label_smoothed_nll_loss(logits, batch.tgt_out, epsilon=epsilon)[0].backward()

    flops = count_flops(step)
    model.zero_grad(set_to_none=True)
    return flops


# ---------------------------------------------------------------- phases (each in its own subprocess)
def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def phase_matmul(spec: dict) -> dict:
    n, reps = spec["n"], spec["reps"]
    device = runtime.pick_device(spec.get("device", "cpu"))  # on CUDA float32 matmuls use TF32 (runtime.use_cuda)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {"n": n, "reps": reps}
    for name in DTYPES:
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=runtime.DTYPES[name]) for _ in range(2))
        c = torch.empty_like(a)
        for _ in range(3):  # thread pool start-up, oneDNN kernel selection, GPU clocks
            torch.mm(a, b, out=c)
        sync()
        times = []
        for _ in range(reps):
            tic = time.perf_counter()
            torch.mm(a, b, out=c)
            sync()
            times.append(time.perf_counter() - tic)
        out[name] = {"gflops": 2 * n**3 / min(times) / 1e9, "gflops_median": 2 * n**3 / statistics.median(times) / 1e9, "seconds_best": min(times)}
    return out


def combine_peaks(start: dict, end: dict) -> dict:
    """The matmul peak of the run: per dtype the faster of the timings at the start and at the end."""
    out = {**start, "peak_rss_mib": max(start["peak_rss_mib"], end["peak_rss_mib"])}
    for name in DTYPES:
        best = max((start[name], end[name]), key=lambda r: r["gflops"])
        out[name] = {**best, "gflops_start": start[name]["gflops"], "gflops_end": end[name]["gflops"]}
    return out


def phase_train(spec: dict) -> dict:
    # The baseline of the CPU speed-ups: torch's own dropout and the unfused logits-then-loss path
    # (the (N, V) logits under autograd), for this phase's process only.
    kernels.use_reference_ops(bool(spec.get("plain_ops")))
    cfg = from_dict(spec["config"], source=f"benchmark {spec['name']}")
    warmup, updates = spec["warmup"], spec["updates"]
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)  # ours (<out>/runs/NAME); Trainer refuses an old run
    marks, tokens, step_seconds = {}, [], []
    cuda = cfg.train.device.startswith("cuda")

    def on_update(update: int, stats: dict) -> None:  # the hook reads the loss: every update ends synchronised
        if update > warmup:
            tokens.append(stats["ntokens"])
            step_seconds.append(stats["seconds"])
        if update in (warmup, warmup + updates):  # the window: end of update `warmup` to end of the last
            marks[update] = time.perf_counter()
            if cuda and update == warmup:
                torch.cuda.reset_peak_memory_stats()

    trainer = Trainer(cfg, resume=False, on_update=on_update)
    if spec.get("compile"):  # the training step (model and fused loss) compiled; shapes vary from batch to batch
        trainer.train_model = torch.compile(trainer.train_model, dynamic=True)
    result = trainer.run()
    gpu_peak_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    if len(marks) < 2:
        raise RuntimeError(f"training stopped at update {result.progress.update} ({result.stop_reason}) before update {warmup + updates}")
    seconds = marks[warmup + updates] - marks[warmup]
    timed = itertools.islice(update_schedule(trainer.train_data, cfg.train), warmup, warmup + updates)  # as Trainer.run took them
    batches = [trainer.train_data.get_batch(idx) for u in timed for idx in u.batches]
    if sum(b.ntokens for b in batches) != sum(tokens):
        raise RuntimeError("the batches replayed for FLOP counting differ from those Trainer.run trained on")
    vocab, sample = trainer.model.output_size, batches[: spec["flop_batches"]]  # K kept pieces with model.restrict_output
    analytic = sum(3 * forward_flops(cfg.model, vocab=vocab, batch=b.nsentences, src_len=b.src.size(1), tgt_len=b.tgt_in.size(1)) for b in batches)
    measured = sum(train_step_flops(trainer.model, b, dtype=cfg.train.dtype, epsilon=cfg.train.label_smoothing) for b in sample)
    ntok, nsent = sum(tokens), sum(b.nsentences for b in batches)
    measured_per_token = measured / sum(b.ntokens for b in sample) if sample else analytic / ntok  # CUDA: the analytic count
    src_tokens = sum(int((b.src != PAD_ID).sum()) for b in batches)
    out = {
        "parameters": count_parameters(trainer.model),
        "vocab_size": vocab,
        "max_tokens": cfg.train.max_tokens,
        "update_freq": cfg.train.update_freq,
        "warmup_updates": warmup,
        "timed_updates": updates,
        "seconds": seconds,
        "update_fn_seconds": sum(step_seconds),
        "target_tokens": ntok,
        "source_tokens": src_tokens,
        "sentences": nsent,
        "avg_src_len": src_tokens / nsent,
        "avg_tgt_len": ntok / nsent,
        "target_padding_fraction": 1 - ntok / sum(b.tgt_out.numel() for b in batches),
        "tokens_per_s": ntok / seconds,
        "updates_per_s": updates / seconds,
        "flops_per_token": measured_per_token,
        "flops_per_token_analytic": analytic / ntok,
        "flop_sample_batches": len(sample),
        "device": cfg.train.device,
        "compiled": bool(spec.get("compile")),
    }
    if cuda:
        out.update(gpu_peak_memory_mib=gpu_peak_mib, gpu=torch.cuda.get_device_name())
    if not spec["keep_checkpoint"]:
        shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    return out


def phase_syncs(spec: dict) -> dict:
    """Host syncs per training update and per search step (the module docstring's ``syncs`` phase)."""
    cfg = from_dict(spec["config"], source=f"benchmark {spec['name']}")
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    trainer = Trainer(cfg, resume=False)
    try:
        updates = []
        for u in itertools.islice(update_schedule(trainer.train_data, cfg.train), 3):
            batches = [trainer.train_data.get_batch(idx) for idx in u.batches]  # collated on the host, outside the count
            with SyncCounter() as syncs:
                trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
            updates.append({"micro_batches": len(batches), "syncs": syncs.total, "kinds": dict(syncs.counts), "collectives": dict(syncs.collectives)})
        model = trainer.model.eval()
        with open(spec["input"], encoding="utf-8") as handle:
            ids = trainer.src_tok.encode([line.rstrip("\n") for line in itertools.islice(handle, 32)])
        model.reserve_positions(positions_needed(max(map(len, ids)) + 1, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b))
        search = []
        for batch in (8, 32):
            src = source_tensor([seq[: cfg.model.max_positions - 1] for seq in ids[:batch]]).to(trainer.device)
            for name, beam in (("greedy", 1), ("beam5", 5)):
                run = (
                    (lambda: greedy_search(model, src, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b))
                    if beam == 1
                    else (lambda: beam_search(model, src, beam=beam, lenpen=cfg.decode.lenpen, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b))
                )
                _, syncs, per_step = per_call(model, "decode_step", run)
                search.append(
                    {
                        "search": name,
                        "beam": beam,
                        "batch": batch,
                        "steps": len(per_step),
                        "total": syncs.total,
                        "per_step_max": max(per_step[:-1], default=0),
                        "per_step_median": statistics.median(per_step[:-1] or [0]),
                        "last_step_and_results": per_step[-1],
                        "kinds": dict(syncs.counts),
                    }
                )
    finally:
        trainer.close()
        shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    return {"device": str(trainer.device), "train_updates": updates, "per_update_max": max(u["syncs"] for u in updates), "search": search}


def phase_translate(spec: dict) -> dict:
    translator = Translator.from_checkpoint(spec["checkpoint"], device=spec.get("device", "cpu"), dtype=spec.get("dtype", "float32"), threads=spec["threads"])
    with open(spec["input"], encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in itertools.islice(handle, spec["sentences"] or None)]
    d, beam = translator.cfg.decode, spec["beam"]
    translator.translate(lines[:8], beam=beam, lenpen=d.lenpen)  # warm-up: allocator, kernel selection
    tic = time.perf_counter()
    stats = translator.translate(lines, beam=beam, lenpen=d.lenpen).stats  # this call's counts only
    seconds = time.perf_counter() - tic
    tokens = stats.tgt_tokens
    return {
        "parameters": count_parameters(translator.model),
        "model_config": dataclasses.asdict(translator.cfg.model),
        "batch_tokens": d.batch_tokens,
        "lenpen": d.lenpen,
        "max_len_a": d.max_len_a,
        "max_len_b": d.max_len_b,
        "sentences": len(lines),
        "seconds": seconds,
        "target_tokens": tokens,
        "avg_output_len": tokens / len(lines),
        "sentences_per_s": len(lines) / seconds,
        "tokens_per_s": tokens / seconds,
    }


def phase_ctranslate2(spec: dict) -> dict:
    """tmt, then CTranslate2 (float32 and int8 weights) on the same lines, beam, batch size and length penalty 0."""
    import ctranslate2

    from transformer_mt.export import export

    translator = Translator.from_checkpoint(spec["checkpoint"], device="cpu", dtype="float32", threads=spec["threads"])
    with open(spec["input"], encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in itertools.islice(handle, spec["sentences"] or None)]
    d, beam = translator.cfg.decode, spec["beam"]
    translator.translate(lines[:8], beam=beam, lenpen=0.0)  # warm-up
    tic = time.perf_counter()
    result = translator.translate(lines, beam=beam, lenpen=0.0)
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
        for n, idx in by_length.items():  # one call per source length: tmt's maximum output, floor(a * (n + EOS) + b)
            out = ct.translate_batch([pieces[i] for i in idx], max_decoding_length=math.floor(d.max_len_a * (n + 1) + d.max_len_b), **options)
            for i, r in zip(idx, out):
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
            "target_tokens": sum(len(h) + 1 for h, line in zip(hyps, lines) if line.strip()),  # + EOS, as tmt
            "same_as_tmt": sum(a == b for a, b in zip(texts, ours)) / len(lines),
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


def ctranslate2_phases(args, checkpoints: list, test_src: Path) -> list[dict]:
    """Run the ``ctranslate2`` phases (``--ctranslate2``) for every translated checkpoint, greedy and beam 5."""
    specs = [
        {
            "kind": "ctranslate2",
            "name": f"ctranslate2-{model}-{search}",
            "threads": args.threads,
            "checkpoint": str(checkpoint),
            "input": str(test_src),
            "sentences": args.sentences,
            "beam": beam,
            "search": search,
            "model": model,
            "representative": representative,
        }
        for model, checkpoint, representative in checkpoints
        for search, beam in (("greedy", 1), ("beam5", 5))
    ]
    rows = []
    for i, spec in enumerate(specs, 1):
        res = run_phase(spec, args.out, step=f"[ctranslate2 {i}/{len(specs)}]")
        rows.append(
            {key: spec[key] for key in ("model", "search", "beam", "checkpoint", "representative")}
            | {"description": describe(res["model_config"], res["parameters"]), **res}
        )
    return rows


PHASES = {
    "matmul": phase_matmul,
    "train": phase_train,
    "translate": phase_translate,
    "syncs": phase_syncs,
    "ctranslate2": phase_ctranslate2,
    "fairseq": fairseq_peer.phase_fairseq,
}


def run_phase_file(spec_path: Path) -> None:
    """Child side: run one phase from its spec file and write its result file."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    torch.set_num_threads(spec["threads"])
    baseline = peak_rss_mib()  # the interpreter with torch and transformer_mt imported
    result = PHASES[spec["kind"]](spec)
    result.update(peak_rss_mib=peak_rss_mib(), rss_after_import_mib=baseline, threads=torch.get_num_threads())
    Path(spec["result"]).write_text(json.dumps(result, indent=1), encoding="utf-8")


def run_phase(spec: dict, out: Path, *, step: str) -> dict:
    """Parent side: run ``spec`` in a fresh interpreter and return its result."""
    phases = out / "phases"
    phases.mkdir(parents=True, exist_ok=True)
    spec_path, spec["result"] = phases / f"{spec['name']}.spec.json", str(phases / f"{spec['name']}.result.json")
    spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    print(f"benchmark: {step} {spec['name']} ...", file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}  # one process, never torchrun's
    env.update(OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--phase", str(spec_path)], env=env, capture_output=True, text=True)
    (phases / f"{spec['name']}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"benchmark: phase {spec['name']} failed (exit {proc.returncode}); its output ends with:\n{tail}")
    return json.loads(Path(spec["result"]).read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the parent: prepare, run, report
def prepare_data(args, recipe: Config, sizes: Sizes, vocab: int) -> tuple[Path, Path, Path]:
    """(spm model, train.en, train.de): the tokenizer trained once into <out>/spm and the corpus encoded
    once into <out>/cache (both reused by later runs; delete them to rebuild)."""
    src, tgt = args.data / "train.en", args.data / "train.de"
    if sizes.train_lines:
        sliced = args.out / "quick-data"
        sliced.mkdir(parents=True, exist_ok=True)
        for path in (src, tgt):
            with open(path, encoding="utf-8") as handle:
                (sliced / path.name).write_text("".join(itertools.islice(handle, sizes.train_lines)), encoding="utf-8")
        src, tgt = sliced / src.name, sliced / tgt.name
    tok = recipe.tokenizer
    prefix = args.out / "spm" / f"joint-{tok.model_type}{vocab}-{sizes.train_lines or 'all'}"
    if not prefix.with_suffix(".model").is_file():
        print(f"benchmark: training sentencepiece {tok.model_type} {vocab} -> {prefix}.model", file=sys.stderr, flush=True)
        train_sentencepiece(
            [src, tgt],
            prefix,
            vocab_size=vocab,
            model_type=tok.model_type,
            character_coverage=tok.character_coverage,
            input_sentence_size=tok.input_sentence_size,
        )
    spm = prefix.with_suffix(".model")
    tokenizer = Tokenizer(spm)
    load_parallel(src, tgt, tokenizer, tokenizer, data_config(recipe, src, tgt, args.out), cache_dir=args.out / "cache", quiet=True)
    return spm, src, tgt


def data_config(recipe: Config, src: Path, tgt: Path, out: Path):
    return dataclasses.replace(recipe.data, train_src=str(src), train_tgt=str(tgt), valid_src="", valid_tgt="", cache_dir=str(out / "cache"))


def train_spec(
    name: str,
    base: Config,
    *,
    dtype: str,
    args,
    sizes: Sizes,
    spm: Path,
    src: Path,
    tgt: Path,
    keep: bool,
    plain: bool = False,
    device: str = "cpu",
    compile_step: bool = False,
    max_tokens: int = 0,
) -> dict:
    total = args.warmup + args.updates
    max_tokens = sizes.max_tokens or max_tokens  # --quick's tiny budget wins
    train = dataclasses.replace(
        base.train,
        out_dir=str(args.out / "runs" / name),
        device=device,
        threads=args.threads,
        dtype=dtype,
        max_updates=total,
        max_epochs=0,
        max_time=0.0,
        patience=0,
        log_every=total + 1,
        validate_every=total + 1,
        save_every=0,
        keep_last=1,
        update_freq=1,
        **({"max_tokens": max_tokens} if max_tokens else {}),
    )
    cfg = Config(
        data=data_config(base, src, tgt, args.out),
        model=dataclasses.replace(base.model, **dict(sizes.model)),
        train=train,
        tokenizer=dataclasses.replace(base.tokenizer, model=str(spm), tgt_model="", joint=True),
        decode=base.decode,
    )
    return {
        "kind": "train",
        "name": name,
        "threads": args.threads,
        "config": to_dict(cfg),
        "warmup": args.warmup,
        "updates": args.updates,
        "flop_batches": 0 if device != "cpu" else sizes.flop_batches,
        "keep_checkpoint": keep,
        "plain_ops": plain,
        "compile": compile_step,
    }


def describe(m: dict, params: int) -> str:
    return f"{m['encoder_layers']}+{m['decoder_layers']} layers, d{m['d_model']}, ff{m['d_ff']}, {m['heads']} heads, {params / 1e6:.2f}M params"


def gpu_bf16_peak(name: str, measured_gflops: float, override_tflops: float = 0.0) -> tuple[float, str]:
    """(FLOP/s, source) of the bfloat16 dense peak MFU is measured against."""
    if override_tflops > 0:
        return override_tflops * 1e12, "--peak-tflops"
    for pattern, tflops in GPU_BF16_PEAK_TFLOPS:
        if pattern in name:
            return tflops * 1e12, f"datasheet bf16 dense peak of {pattern} (quoted, not measured)"
    return measured_gflops * 1e9, "measured bf16 matmul peak (GPU not in the datasheet table)"


def cuda_plan(args, sizes: Sizes, recipe: Config, *, spm: Path, src: Path, tgt: Path, test_src: Path) -> list[dict]:
    """The phases of ``--device cuda``: matmul peak (bf16, fp32 with TF32); training of the paper's base and big
    models at 25k-token batches and of the recipe model at its own, each in bf16 and fp32 (TF32), plus base
    and big compiled with torch.compile when --compile; greedy and beam-5 translation; the sync counts."""
    models = [
        ("base", load_config(REPO / "configs" / "transformer_base.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("big", load_config(REPO / "configs" / "transformer_big.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("recipe", recipe, 0),
    ]
    specs = [{"kind": "matmul", "name": "matmul", "threads": args.threads, "n": sizes.matmul_n, "reps": sizes.matmul_reps, "device": "cuda"}]
    keep_recipe = args.checkpoint is None  # then the recipe's bf16 run is translated (not representative: barely trained)
    for model, base, batch_tokens in models:
        for dtype in ("bfloat16", "float32"):
            specs.append(
                train_spec(
                    f"train-{model}-{dtype}",
                    base,
                    dtype=dtype,
                    args=args,
                    sizes=sizes,
                    spm=spm,
                    src=src,
                    tgt=tgt,
                    keep=keep_recipe and model == "recipe" and dtype == "bfloat16",
                    device="cuda",
                    max_tokens=batch_tokens,
                )
            )
        if args.compile and model != "recipe":
            specs.append(
                train_spec(
                    f"train-{model}-bfloat16-compiled",
                    base,
                    dtype="bfloat16",
                    args=args,
                    sizes=sizes,
                    spm=spm,
                    src=src,
                    tgt=tgt,
                    keep=False,
                    device="cuda",
                    max_tokens=batch_tokens,
                    compile_step=True,
                )
            )
    checkpoint = args.checkpoint or args.out / "runs" / "train-recipe-bfloat16" / "checkpoint_last.pt"
    for search, beam, dtype in (("greedy", 1, "float32"), ("beam5", 5, "float32"), ("beam5", 5, "bfloat16")):
        specs.append(
            {
                "kind": "translate",
                "name": f"translate-recipe-{search}-{dtype}",
                "threads": args.threads,
                "checkpoint": str(checkpoint),
                "input": str(test_src),
                "sentences": args.sentences,
                "beam": beam,
                "search": search,
                "model": "recipe",
                "representative": not keep_recipe,
                "device": "cuda",
                "dtype": dtype,
            }
        )
    specs.append(
        {
            **train_spec("syncs-recipe-float32", recipe, dtype="float32", args=args, sizes=sizes, spm=spm, src=src, tgt=tgt, keep=False, device="cuda"),
            "kind": "syncs",
            "input": str(test_src),
        }
    )
    specs.append({**specs[0], "name": "matmul-end"})
    return specs


def run_specs(specs: list[dict], out: Path) -> tuple[dict, list[tuple[dict, dict]]]:
    """Run every phase; specs[0] and specs[-1] time the matmul peak at both ends (the faster is kept).
    Returns the combined peak and the (spec, result) pairs of the phases between them."""
    results = [run_phase(spec, out, step=f"[{i}/{len(specs)}]") for i, spec in enumerate(specs, 1)]
    return combine_peaks(results[0], results[-1]), list(zip(specs[1:-1], results[1:-1]))


def add_rates(spec: dict, res: dict, matmul: dict) -> tuple[str, str]:
    """A training phase's achieved GFLOP/s and fraction of the same dtype's matmul peak, added to ``res``;
    returns its (model, dtype) from the phase name train-MODEL-DTYPE[-...]."""
    model, dtype = spec["name"].split("-")[1:3]
    res["gflops"] = res["flops_per_token"] * res["tokens_per_s"] / 1e9
    res["fraction_of_peak"] = res["gflops"] / matmul[dtype]["gflops"]
    return model, dtype


def split_phases(phases: list, matmul: dict) -> tuple[list, list, dict]:
    """The timed phases by kind: training as (spec, result, model, dtype) with GFLOP/s and share of the peak
    filled in (:func:`add_rates`), translation as (spec, result), and the syncs phase's result ({} if none)."""
    trained, translated, syncs = [], [], {}
    for spec, res in phases:
        if spec["kind"] == "syncs":
            syncs = res
        elif spec["kind"] == "train":
            trained.append((spec, res, *add_rates(spec, res, matmul)))
        else:
            translated.append((spec, res))
    return trained, translated, syncs


def run_cuda(args, sizes: Sizes, recipe: Config, *, config: Path, note: str, test_src: Path) -> dict:
    """``--device cuda``: the same JSON and markdown as on CPU, rows from :func:`cuda_plan`, MFU against the GPU's
    bf16 dense peak, peak GPU memory (torch.cuda.max_memory_allocated) per training row."""
    load_start = os.getloadavg()
    spm, src, tgt = prepare_data(args, recipe, sizes, sizes.spm_vocab or recipe.tokenizer.vocab_size)
    specs = cuda_plan(args, sizes, recipe, spm=spm, src=src, tgt=tgt, test_src=test_src)
    matmul, phases = run_specs(specs, args.out)
    gpu = next((res["gpu"] for _, res in phases if "gpu" in res), torch.cuda.get_device_name() if torch.cuda.is_available() else "?")
    peak, peak_source = gpu_bf16_peak(gpu, matmul["bfloat16"]["gflops"], args.peak_tflops)
    trained, translated, syncs = split_phases(phases, matmul)
    training, translation = [], []
    for spec, res, model, dtype in trained:
        res["mfu"] = res["gflops"] * 1e9 / peak
        mcfg = spec["config"]["model"]
        training.append(
            {
                "model": model,
                "dtype": dtype,
                "ops": "compiled" if spec["compile"] else "fast",
                "description": describe(mcfg, res["parameters"]),
                "model_config": mcfg,
                **res,
                "vs_quoted": None,
                "speedup_vs_plain_ops": None,
            }
        )
    for spec, res in translated:
        translation.append(
            {
                "search": spec["search"],
                "beam": spec["beam"],
                "dtype": spec["dtype"],
                "model": spec["model"],
                "description": describe(res["model_config"], res["parameters"]),
                "checkpoint": spec["checkpoint"],
                "representative": spec["representative"],
                "reference_size": False,
                **res,
                "vs_quoted": None,
            }
        )
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "device": "cuda",
        "gpu": gpu,
        "bf16_dense_peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "machine": machine_info(),
        "threads": args.threads,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "settings": {
            "config": str(config),
            "config_note": note,
            "data": str(args.data),
            "spm_model": str(spm),
            "warmup_updates": args.warmup,
            "timed_updates": args.updates,
            "sentences": args.sentences,
            "checkpoint": str(args.checkpoint or ""),
            "reference_checkpoint": "",
            "test_input": str(test_src),
            "batch_tokens_base_big": GPU_BATCH_TOKENS,
            "compile": args.compile,
        },
        "matmul_peak": matmul,
        "training": training,
        "translation": translation,
        "syncs": syncs,
        "quoted_reference": QUOTED,
        "ctranslate2": [],
    }


def run_all(args, sizes: Sizes) -> dict:
    config, note = args.config, ""
    if not config.is_file() and config.resolve() == RECIPE_CONFIG:
        config, note = FALLBACK_CONFIG, f"{RECIPE_CONFIG.relative_to(REPO)} not found: recipe model from {FALLBACK_CONFIG.relative_to(REPO)}"
        print(f"benchmark: {note}", file=sys.stderr)
    recipe = load_config(config, check_files=False)
    test_src = args.data / "test_2016_flickr.en"
    for path in (args.data / "train.en", args.data / "train.de", test_src):
        if not path.is_file():
            raise SystemExit(f"benchmark: {path} not found; pass --data DIR holding Multi30k (scripts/prepare_multi30k.sh downloads it)")
    if args.device == "cuda":
        return run_cuda(args, sizes, recipe, config=config, note=note, test_src=test_src)
    load_start = os.getloadavg()
    spm, src, tgt = prepare_data(args, recipe, sizes, sizes.spm_vocab or recipe.tokenizer.vocab_size)
    ref_spm = prepare_data(args, recipe, sizes, sizes.spm_vocab or REFERENCE_VOCAB)[0]
    reference = Config(
        model=ModelConfig(**REFERENCE_MODEL), train=TrainConfig(**REFERENCE_TRAIN), decode=DecodeConfig(), data=recipe.data, tokenizer=recipe.tokenizer
    )
    keep_ref = args.reference_checkpoint is None
    specs = [{"kind": "matmul", "name": "matmul", "threads": args.threads, "n": sizes.matmul_n, "reps": sizes.matmul_reps}]
    for model, base, model_spm in (("reference", reference, ref_spm), ("recipe", recipe, spm)):
        for dtype in DTYPES:
            specs.append(
                train_spec(
                    f"train-{model}-{dtype}",
                    base,
                    dtype=dtype,
                    args=args,
                    sizes=sizes,
                    spm=model_spm,
                    src=src,
                    tgt=tgt,
                    keep=keep_ref and model == "reference" and dtype == "float32",
                )
            )
        specs.append(
            train_spec(f"train-{model}-float32-plain", base, dtype="float32", args=args, sizes=sizes, spm=model_spm, src=src, tgt=tgt, keep=False, plain=True)
        )
    checkpoints = [("reference", args.reference_checkpoint or args.out / "runs" / "train-reference-float32" / "checkpoint_last.pt", not keep_ref)]
    if args.checkpoint is not None:
        checkpoints.append(("recipe", args.checkpoint, True))
    for model, checkpoint, representative in checkpoints:
        for search, beam in (("greedy", 1), ("beam5", 5)):
            specs.append(
                {
                    "kind": "translate",
                    "name": f"translate-{model}-{search}",
                    "threads": args.threads,
                    "checkpoint": str(checkpoint),
                    "input": str(test_src),
                    "sentences": args.sentences,
                    "beam": beam,
                    "search": search,
                    "model": model,
                    "representative": representative,
                }
            )
    syncs_spec = {
        **train_spec("syncs-recipe-float32", recipe, dtype="float32", args=args, sizes=sizes, spm=spm, src=src, tgt=tgt, keep=False),
        "kind": "syncs",
        "input": str(test_src),
    }
    peer = fairseq_peer.plan(args, sizes, spm=ref_spm, src=src, tgt=tgt, train_spec=train_spec) if args.peer else []
    specs = [specs[0], *peer] if args.only == "peer" else [*specs, syncs_spec, *peer]
    # The peak is timed again at the end: a neighbour's burst during one short timing would otherwise
    # set the peak too low (one run measured half the usual float32 rate and "107% of peak").
    specs.append({**specs[0], "name": "matmul-end"})
    matmul, phases = run_specs(specs, args.out)
    peer_phases, phases = [p for p in phases if p[0].get("peer")], [p for p in phases if not p[0].get("peer")]
    trained, translated, syncs = split_phases(phases, matmul)
    training, translation = [], []
    for spec, res, model, dtype in trained:
        vs = None
        if model == "reference" and not spec["plain_ops"]:
            ratio = res["tokens_per_s"] / TRAIN_QUOTED
            vs = {"quoted": TRAIN_QUOTED, "ratio": ratio, "target_ratio": TRAIN_TARGET, "meets_target": ratio >= TRAIN_TARGET}
        mcfg = spec["config"]["model"]
        training.append(
            {
                "model": model,
                "dtype": dtype,
                "ops": "plain" if spec["plain_ops"] else "fast",
                "description": describe(mcfg, res["parameters"]),
                "model_config": mcfg,
                **res,
                "vs_quoted": vs,
            }
        )
    for spec, res in translated:
        vs = None
        reference_size = all(res["model_config"][k] == REFERENCE_MODEL[k] for k in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads"))
        if spec["beam"] == 5 and spec["model"] == "reference" and (reference_size or args.quick):
            ratio = res["sentences_per_s"] / BEAM5_QUOTED
            vs = {"quoted": BEAM5_QUOTED, "ratio": ratio, "target_ratio": BEAM5_TARGET, "meets_target": ratio >= BEAM5_TARGET}
        translation.append(
            {
                "search": spec["search"],
                "beam": spec["beam"],
                "dtype": "float32",
                "model": spec["model"],
                "description": describe(res["model_config"], res["parameters"]),
                "checkpoint": spec["checkpoint"],
                "representative": spec["representative"],
                "reference_size": reference_size,
                **res,
                "vs_quoted": vs,
            }
        )
    for t in training:  # the speed-ups, as a ratio over the plain-ops run of the same model, batches and dtype
        plain = next((p for p in training if p["ops"] == "plain" and p["model"] == t["model"] and p["dtype"] == t["dtype"]), None)
        t["speedup_vs_plain_ops"] = t["tokens_per_s"] / plain["tokens_per_s"] if plain and t["ops"] == "fast" else None
    ctranslate2_rows = ctranslate2_phases(args, checkpoints, test_src) if args.ctranslate2 else []
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine_info(),
        "threads": args.threads,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "settings": {
            "config": str(config),
            "config_note": note,
            "data": str(args.data),
            "spm_model": str(spm),
            "warmup_updates": args.warmup,
            "timed_updates": args.updates,
            "sentences": args.sentences,
            "checkpoint": str(args.checkpoint or ""),
            "reference_checkpoint": str(args.reference_checkpoint or ""),
            "test_input": str(test_src),
            "reference_model": REFERENCE_MODEL,
            "reference_train": REFERENCE_TRAIN,
        },
        "matmul_peak": matmul,
        "training": training,
        "translation": translation,
        "syncs": syncs,
        "quoted_reference": QUOTED,
        "ctranslate2": ctranslate2_rows,
        "peer": fairseq_peer.report(peer_phases, matmul) if peer_phases else None,
    }


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


COLUMNS = ["phase", "model", "dtype", "tokens/s", "updates/s", "sentences/s", "GFLOP/s", "% of peak", "peak RSS MiB", "vs quoted reference"]


COLUMNS_CUDA = ["phase", "model", "dtype", "tokens/s", "updates/s", "sentences/s", "TFLOP/s", "MFU %", "peak GPU MiB", "notes"]


def render_markdown_cuda(r: dict) -> str:
    """The ``--device cuda`` report: MFU against the bf16 dense peak, peak GPU memory per training row."""

    def num(x, fmt: str) -> str:
        return "" if x is None else format(x, fmt)

    mm = r["matmul_peak"]
    rows = [
        [f"matmul peak (n={mm['n']})", "", d + (" (TF32)" if d == "float32" else ""), "", "", "", num(mm[d]["gflops"] / 1e3, ".1f"), "", "", ""] for d in DTYPES
    ]
    for t in r["training"]:
        note = f"{t['max_tokens']:,}-token batches" + ("; torch.compile" if t["ops"] == "compiled" else "")
        rows.append(
            [
                f"train{' [compiled]' if t['ops'] == 'compiled' else ''}",
                f"{t['model']} ({t['description']})",
                t["dtype"] + (" (TF32)" if t["dtype"] == "float32" else ""),
                num(t["tokens_per_s"], ",.0f"),
                num(t["updates_per_s"], ".2f"),
                "",
                num(t["gflops"] / 1e3, ".1f"),
                num(100 * t["mfu"], ".1f"),
                num(t.get("gpu_peak_memory_mib"), ",.0f"),
                note,
            ]
        )
    for t in r["translation"]:
        flag = "" if t["representative"] else " †"
        rows.append(
            [
                f"translate {t['search']}{flag}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                num(t["tokens_per_s"], ",.0f"),
                "",
                num(t["sentences_per_s"], ".1f"),
                "",
                "",
                "",
                f"{t['sentences']} sentences",
            ]
        )
    m, s = r["machine"], r["settings"]
    lines = [
        f"# transformer_mt benchmark on {r['gpu']}{' (quick mode: tiny models, not a measurement)' if r['quick'] else ''}",
        "",
        f"{r['date']}; {r['gpu']}; host {m['cpu']}; torch {m['torch']}.",
        f"Training: {s['warmup_updates']} untimed + {s['timed_updates']} timed updates; tokens/s = non-pad target tokens per second. "
        f"MFU: model FLOPs (the analytic formula, padding included) per second over the bf16 dense peak, "
        f"{r['bf16_dense_peak_tflops']:.1f} TFLOP/s ({r['peak_source']}), for the float32 (TF32) rows too.",
        "",
        "| " + " | ".join(COLUMNS_CUDA) + " |",
        "|" + "---|" * len(COLUMNS_CUDA),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if r.get("syncs"):
        lines.append("")
        lines.append(syncs_line(r["syncs"]))
    if any(not t["representative"] for t in r["translation"]):
        lines.append("† not representative: the recipe model after only the benchmark's updates (outputs too long); pass --checkpoint.")
    return "\n".join(lines) + "\n"


def syncs_line(sy: dict) -> str:
    steps = "; ".join(f"{t['search']} batch {t['batch']}: {t['per_step_max']} (median {t['per_step_median']:g})" for t in sy["search"])
    return (
        f"Host syncs ({sy['device']}, transformer_mt.runtime.syncs.SyncCounter): per training update of the recipe model "
        f"{', '.join(str(u['syncs']) for u in sy['train_updates'])} (budget 1); per search step, the most over the steps: {steps} "
        "(budget 1, whatever the batch and beam)."
    )


def render_markdown(r: dict) -> str:
    if r.get("device") == "cuda":
        return render_markdown_cuda(r)

    def num(x, fmt: str) -> str:
        return "" if x is None else format(x, fmt)

    def vs(v, unit: str) -> str:
        return "" if v is None else f"{v['ratio']:.2f}x of {v['quoted']:,.0f} {unit} (target {v['target_ratio']:g}x)"

    mm = r["matmul_peak"]
    rows = [[f"matmul peak (n={mm['n']})", "", d, "", "", "", num(mm[d]["gflops"], ".1f"), "", num(mm["peak_rss_mib"], ".0f"), ""] for d in DTYPES]
    for t in r["training"]:
        plain = " [plain ops]" if t["ops"] == "plain" else ""
        speedup = "" if t.get("speedup_vs_plain_ops") is None else f"{t['speedup_vs_plain_ops']:.2f}x of plain ops"
        versus = "; ".join(x for x in (vs(t["vs_quoted"], "tok/s (fairseq)"), speedup) if x)
        rows.append(
            [
                f"train{plain}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                num(t["tokens_per_s"], ",.0f"),
                num(t["updates_per_s"], ".3f"),
                "",
                num(t["gflops"], ".1f"),
                num(100 * t["fraction_of_peak"], ".1f"),
                num(t["peak_rss_mib"], ".0f"),
                versus,
            ]
        )
    for t in r["translation"]:
        flag = "" if t["representative"] else " †"
        rows.append(
            [
                f"translate {t['search']}{flag}",
                f"{t['model']} ({t['description']})",
                t["dtype"],
                num(t["tokens_per_s"], ",.0f"),
                "",
                num(t["sentences_per_s"], ".1f"),
                "",
                "",
                num(t["peak_rss_mib"], ".0f"),
                vs(t["vs_quoted"], "sent/s (fairseq)"),
            ]
        )
    for t in r.get("ctranslate2", []):  # --ctranslate2: tmt and CTranslate2 on the same checkpoint, lines and settings
        flag = "" if t["representative"] else " †"
        for engine, e in t["engines"].items():
            ratio = e["tokens_per_s"] / t["engines"]["tmt"]["tokens_per_s"]
            versus = "" if engine == "tmt" else f"{ratio:.2f}x of tmt's tokens/s; {100 * e['same_as_tmt']:.0f}% same output"
            rows.append(
                [
                    f"translate {t['search']} lenpen 0 [{'tmt' if engine == 'tmt' else 'CTranslate2'}]{flag}",
                    f"{t['model']} ({t['description']})",
                    "float32" if engine == "tmt" else engine,
                    num(e["tokens_per_s"], ",.0f"),
                    "",
                    num(e["sentences_per_s"], ".1f"),
                    "",
                    "",
                    num(t["peak_rss_mib"], ".0f"),
                    versus,
                ]
            )
    m, s = r["machine"], r["settings"]
    lines = [
        f"# transformer_mt benchmark{' (quick mode: tiny models, not a measurement)' if r['quick'] else ''}",
        "",
        f"{r['date']}; {m['cpu']}, {m['logical_cpus']} logical CPUs, {r['threads']} threads; torch {m['torch']} ({m['cpu_capability']}); "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end.",
        f"Training: {s['warmup_updates']} untimed + {s['timed_updates']} timed updates; tokens/s = non-pad target tokens per second. "
        f"Config: {s['config']}{' (' + s['config_note'] + ')' if s['config_note'] else ''}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    q = r["quoted_reference"]
    lines += [
        "",
        "Plain ops: the same training with torch's F.dropout and the unfused logits + loss path (kernels.use_reference_ops), "
        "the baseline of the CPU speed-ups. GFLOP/s: measured (FlopCounterMode) FLOPs per target token x tokens/s; % of peak: "
        "of the matmul peak of the same dtype (the faster of its timings at the start and at the end of the run) "
        "measured above. Peak RSS: each phase in its own process, the interpreter and torch included.",
        f"Quoted reference figures are {q['source']}: training {', '.join(f'{k} {v:,} tok/s' for k, v in q['train_tokens_per_s'].items())}; "
        f"beam 5 {', '.join(f'{k} {v} sent/s' for k, v in q['beam5_sentences_per_s'].items())} ({q['setting']}); "
        f"matmul peak {q['matmul_peak_gflops']['float32']} GFLOP/s float32, {q['matmul_peak_gflops']['bfloat16']} bfloat16.",
    ]
    if r.get("ctranslate2"):
        lines.append(
            f"CTranslate2 {r['ctranslate2'][0]['ctranslate2_version']} rows: the checkpoint exported by `tmt export`, tmt and "
            "CTranslate2 in one process each with length penalty 0, one CTranslate2 call per source length (tmt's maximum output "
            "length is per sentence); peak RSS is the phase's (both engines)."
        )
    if r.get("syncs"):
        lines.append(syncs_line(r["syncs"]))
    if any(not t["representative"] for t in r["translation"]):
        lines.append("† not representative: the reference model after only the benchmark's updates (outputs too long); pass --reference-checkpoint.")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=RECIPE_CONFIG, help="recipe config (default configs/multi30k_en_de.yaml, else multi30k_small.yaml)")
    p.add_argument("--data", type=Path, default=None, help="Multi30k directory (default ../shared/data/multi30k beside the repo, else data/multi30k)")
    p.add_argument("--out", type=Path, default=Path("bench"), help="output directory; also holds the cached tokenizer and corpus")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads in every phase")
    p.add_argument("--warmup", type=int, default=None, help=f"untimed updates per training run (default {FULL.warmup}, quick {QUICK.warmup})")
    p.add_argument("--updates", type=int, default=None, help=f"timed updates per training run (default {FULL.updates}, quick {QUICK.updates})")
    p.add_argument("--sentences", type=int, default=None, help="test sentences translated (default all 1000, quick 20)")
    p.add_argument("--checkpoint", type=Path, default=None, help="the trained recipe model: its translation speed is timed too")
    p.add_argument(
        "--reference-checkpoint",
        type=Path,
        default=None,
        help="a trained 3+3/d256 model, the size of the quoted fairseq beam-5 figure (else the benchmark's barely trained one)",
    )
    p.add_argument("--ctranslate2", action="store_true", help="also decode each translated checkpoint with CTranslate2 (needs the export extra)")
    p.add_argument("--quick", action="store_true", help="tiny models and sizes, seconds: checks the script, measures nothing")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU plan (base and big at 25k-token batches, bf16 and fp32+TF32, the recipe; MFU, peak GPU memory)",
    )
    p.add_argument("--compile", action="store_true", help="--device cuda: also train base and big in bf16 with torch.compile")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="--device cuda: the bf16 dense peak for MFU (default: datasheet table)")
    p.add_argument("--dry-run", action="store_true", help="print the phases as JSON and exit: nothing is trained, measured or put on a GPU")
    fairseq_peer.add_arguments(p)  # --peer, --fairseq-env, --peer-updates, --only
    p.add_argument("--phase", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run one phase's spec
    args = p.parse_args(argv)
    sizes = sizes_for(args)
    args.warmup = sizes.warmup if args.warmup is None else args.warmup
    args.updates = sizes.updates if args.updates is None else args.updates
    args.sentences = sizes.sentences if args.sentences is None else args.sentences
    if args.data is None:
        shared = REPO.parent / "shared" / "data" / "multi30k"
        args.data = shared if shared.is_dir() else REPO / "data" / "multi30k"
    if args.device == "cpu" and (args.compile or args.peak_tflops):
        p.error("--compile and --peak-tflops go with --device cuda")
    if args.device == "cuda" and (args.ctranslate2 or args.reference_checkpoint):
        p.error("--ctranslate2 and --reference-checkpoint are CPU comparisons; leave them out with --device cuda")
    if args.device == "cuda" and not args.dry_run and args.phase is None and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU here (--dry-run prints the plan without one)")
    for key in ("threads", "warmup", "updates"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    if args.sentences < 0:
        p.error(f"--sentences must be 0 (all) or positive, got {args.sentences}")
    for key in ("checkpoint", "reference_checkpoint"):
        path = getattr(args, key)
        if path is not None and not path.is_file():
            p.error(f"--{key.replace('_', '-')} {path}: file not found")
    fairseq_peer.check_arguments(p, args)
    return args


def sizes_for(args) -> Sizes:
    if args.device == "cuda":
        return QUICK_CUDA if args.quick else FULL_CUDA
    return QUICK if args.quick else FULL


def dry_run(args) -> list[dict]:
    """The phases the run would take, in order, with placeholder data paths (nothing prepared or run)."""
    recipe = load_config(args.config if args.config.is_file() else FALLBACK_CONFIG, check_files=False)
    sizes, data = sizes_for(args), args.out / "<prepared>"
    paths = dict(spm=data / "spm.model", src=data / "train.en", tgt=data / "train.de", test_src=args.data / "test_2016_flickr.en")
    if args.device == "cuda":
        return cuda_plan(args, sizes, recipe, **paths)
    raise SystemExit("benchmark: --dry-run lists the --device cuda plan; the CPU plan is the module docstring's")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.phase is not None:
        run_phase_file(args.phase)
        return
    if args.dry_run:
        print(json.dumps(dry_run(args), indent=1, default=str))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.out, args.data = args.out.resolve(), args.data.resolve()
    args.checkpoint = args.checkpoint.resolve() if args.checkpoint else None
    args.reference_checkpoint = args.reference_checkpoint.resolve() if args.reference_checkpoint else None
    report = run_all(args, sizes_for(args))
    (args.out / "benchmark.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    markdown = fairseq_peer.render(report).lstrip() if args.only == "peer" else render_markdown(report) + fairseq_peer.render(report)
    (args.out / "benchmark.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"benchmark: wrote {args.out / 'benchmark.json'} and {args.out / 'benchmark.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
