"""benchmark.json: the phases' results as rows, with the rates, ratios and the machine they were measured on.

A training row's GFLOP/s is its measured FLOPs per target token x tokens/s, and its share of the peak is
over the matmul peak of the same dtype; on ``--device cuda`` its MFU is over the GPU's bf16 dense peak.
The reference model's rows are set beside the quoted figures of :data:`transformer_mt.benchmark.settings.QUOTED`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path
from typing import NamedTuple

import torch

from transformer_mt.benchmark import peer
from transformer_mt.benchmark.settings import (
    BEAM5_QUOTED,
    BEAM5_TARGET,
    GPU_BATCH_TOKENS,
    QUOTED,
    REFERENCE_MODEL,
    REFERENCE_TRAIN,
    SCHEMA,
    TRAIN_QUOTED,
    TRAIN_TARGET,
)


class Where(NamedTuple):
    """What the run measured on: the recipe config (and a note when it is the fallback), the tokenizer, the test
    input."""

    config: Path
    note: str
    spm: Path
    test_src: Path


def describe(m: dict, params: int) -> str:
    layers = f"{m['encoder_layers']}+{m['decoder_layers']} layers"
    return f"{layers}, d{m['d_model']}, ff{m['d_ff']}, {m['heads']} heads, {params / 1e6:.2f}M params"


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


def split_phases(phases: list, matmul: dict) -> tuple[list, list, dict]:
    """The timed phases by kind: training as (spec, result, model, dtype) with GFLOP/s and share of the peak
    filled in, translation as (spec, result), and the syncs phase's result ({} if none)."""
    trained, translated, syncs = [], [], {}
    for spec, res in phases:
        if spec["kind"] == "syncs":
            syncs = res
        elif spec["kind"] == "train":
            model, dtype = spec["name"].split("-")[1:3]  # train-MODEL-DTYPE[-...]
            res["gflops"] = res["flops_per_token"] * res["tokens_per_s"] / 1e9
            res["fraction_of_peak"] = res["gflops"] / matmul[dtype]["gflops"]
            trained.append((spec, res, model, dtype))
        else:
            translated.append((spec, res))
    return trained, translated, syncs


def training_row(spec: dict, res: dict, model: str, dtype: str, *, ops: str, vs_quoted: dict | None) -> dict:
    mcfg = spec["config"]["model"]
    return {
        "model": model,
        "dtype": dtype,
        "ops": ops,
        "description": describe(mcfg, res["parameters"]),
        "model_config": mcfg,
        **res,
        "vs_quoted": vs_quoted,
    }


def translation_row(spec: dict, res: dict, *, dtype: str, reference_size: bool, vs_quoted: dict | None) -> dict:
    return {
        "search": spec["search"],
        "beam": spec["beam"],
        "dtype": dtype,
        "model": spec["model"],
        "description": describe(res["model_config"], res["parameters"]),
        "checkpoint": spec["checkpoint"],
        "representative": spec["representative"],
        "reference_size": reference_size,
        **res,
        "vs_quoted": vs_quoted,
    }


def versus(value: float, quoted: float, target: float) -> dict:
    ratio = value / quoted
    return {"quoted": quoted, "ratio": ratio, "target_ratio": target, "meets_target": ratio >= target}


def cpu_training(trained: list) -> list[dict]:
    """Training rows; the reference model's against the quoted fairseq tokens/s, every fast row's speed-up
    as a ratio over the plain-ops run of the same model, batches and dtype."""
    rows = []
    for spec, res, model, dtype in trained:
        vs = (
            versus(res["tokens_per_s"], TRAIN_QUOTED, TRAIN_TARGET)
            if model == "reference" and not spec["plain_ops"]
            else None
        )
        rows.append(training_row(spec, res, model, dtype, ops="plain" if spec["plain_ops"] else "fast", vs_quoted=vs))
    for t in rows:
        plain = next(
            (p for p in rows if p["ops"] == "plain" and p["model"] == t["model"] and p["dtype"] == t["dtype"]), None
        )
        t["speedup_vs_plain_ops"] = t["tokens_per_s"] / plain["tokens_per_s"] if plain and t["ops"] == "fast" else None
    return rows


def cpu_translation(translated: list, *, quick: bool) -> list[dict]:
    """Translation rows; the reference-size model's beam 5 against the quoted fairseq sentences/s."""
    rows = []
    for spec, res in translated:
        reference_size = all(
            res["model_config"][k] == REFERENCE_MODEL[k]
            for k in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads")
        )
        vs = None
        if spec["beam"] == 5 and spec["model"] == "reference" and (reference_size or quick):
            vs = versus(res["sentences_per_s"], BEAM5_QUOTED, BEAM5_TARGET)
        rows.append(translation_row(spec, res, dtype="float32", reference_size=reference_size, vs_quoted=vs))
    return rows


def ctranslate2_rows(phases: list[tuple[dict, dict]]) -> list[dict]:
    keys = ("model", "search", "beam", "checkpoint", "representative")
    return [
        {key: spec[key] for key in keys} | {"description": describe(res["model_config"], res["parameters"]), **res}
        for spec, res in phases
    ]


def _header(args: argparse.Namespace, load_start: tuple, **extra: object) -> dict:
    return {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        **extra,
        "machine": machine_info(),
        "threads": args.threads,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
    }


def _settings(args: argparse.Namespace, where: Where, **extra: object) -> dict:
    return {
        "config": str(where.config),
        "config_note": where.note,
        "data": str(args.data),
        "spm_model": str(where.spm),
        "warmup_updates": args.warmup,
        "timed_updates": args.updates,
        "sentences": args.sentences,
        "checkpoint": str(args.checkpoint or ""),
        "reference_checkpoint": str(args.reference_checkpoint or ""),
        "test_input": str(where.test_src),
        **extra,
    }


def cpu_report(
    args: argparse.Namespace, where: Where, *, load_start: tuple, matmul: dict, phases: list, ct2_phases: list
) -> dict:
    """The CPU report: the rows of the timed phases and of the CTranslate2 phases, and the peer section."""
    peer_phases, phases = [p for p in phases if p[0].get("peer")], [p for p in phases if not p[0].get("peer")]
    trained, translated, syncs = split_phases(phases, matmul)
    return {
        **_header(args, load_start),
        "settings": _settings(args, where, reference_model=REFERENCE_MODEL, reference_train=REFERENCE_TRAIN),
        "matmul_peak": matmul,
        "training": cpu_training(trained),
        "translation": cpu_translation(translated, quick=args.quick),
        "syncs": syncs,
        "quoted_reference": QUOTED,
        "ctranslate2": ctranslate2_rows(ct2_phases),
        "peer": peer.report(peer_phases, matmul) if peer_phases else None,
    }


def cuda_report(
    args: argparse.Namespace,
    where: Where,
    *,
    load_start: tuple,
    matmul: dict,
    phases: list,
    gpu: str,
    peak: tuple[float, str],
) -> dict:
    """The ``--device cuda`` report: the CPU report's schema, MFU against the GPU's bf16 dense peak
    (``peak``: FLOP/s and its source), peak GPU memory per training row."""
    trained, translated, syncs = split_phases(phases, matmul)
    training = []
    for spec, res, model, dtype in trained:
        res["mfu"] = res["gflops"] * 1e9 / peak[0]
        row = training_row(spec, res, model, dtype, ops="compiled" if spec["compile"] else "fast", vs_quoted=None)
        training.append({**row, "speedup_vs_plain_ops": None})
    translation = [
        translation_row(spec, res, dtype=spec["dtype"], reference_size=False, vs_quoted=None)
        for spec, res in translated
    ]
    header = _header(
        args, load_start, device="cuda", gpu=gpu, bf16_dense_peak_tflops=peak[0] / 1e12, peak_source=peak[1]
    )
    return {
        **header,
        "settings": _settings(args, where, batch_tokens_base_big=GPU_BATCH_TOKENS, compile=args.compile),
        "matmul_peak": matmul,
        "training": training,
        "translation": translation,
        "syncs": syncs,
        "quoted_reference": QUOTED,
        "ctranslate2": [],
    }
