"""``scripts/gpu_check.sh``: the one prepared run of a lent GPU, as phases of this benchmark, and its one table.

What it compares, each row in a process of its own (:mod:`transformer_mt.benchmark.runner`):

- training of the paper's base and big models (25k-token batches) and of the recipe model, in bf16, **eager**
  (the ``reference`` ops: plain torch, padded batches, nothing compiled) against the **cuda backend** (``train.ops:
  cuda`` with its defaults: compiled layer stacks and loss, packed batches); base also on the backend with padded
  batches (what packing adds); the recipe also in float32 (TF32), the setting bf16 must not lose to;
- the losses of the cuda backend against the reference backend over the same first updates of base, dropout off
  (the same batches; bf16 rounding is the only difference allowed);
- greedy and beam-5 decoding of test_2016_flickr by the recipe checkpoint, eager and with the static cache and the
  graphed step, beside CTranslate2 on the same GPU when its wheel runs there.

Throughput is non-pad target tokens per second of the timed updates. MFU is the issue's and the papers' formula,
6 x parameters (the output layer included, counted once when tied) x target tokens per second, over two peaks: the
bf16 matmul peak measured at the start and end of the run, and the datasheet's dense bf16 peak. Peak GPU memory is
``torch.cuda.max_memory_allocated`` over the timed updates; compiles are dynamo's unique graphs in the phase's
process, graph breaks its break count.

On a CPU (``--device cpu``, with ``--quick``) the same plan runs with tiny sizes, the cuda backend's rows taking the
reference ops compiled with ``aot_eager`` and packed batches: a test proves the plan, the phases and the table there.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from transformer_mt.benchmark.phases import read_input
from transformer_mt.benchmark.settings import GPU_BATCH_TOKENS, REPO, Sizes
from transformer_mt.benchmark.specs import train_spec, translate_spec
from transformer_mt.config import Config, from_dict, load_config
from transformer_mt.training import Trainer, UpdateStats, set_up

# The two training settings every model is timed in (train.* keys), per device kind.
EAGER = {"ops": "reference", "compile": "off", "packed": "off"}
BACKEND = {
    "cuda": {"ops": "cuda", "compile": "auto", "packed": "auto"},
    "cpu": {"ops": "reference", "compile": "aot_eager", "packed": "on"},  # the plan proved on a CPU
}
AGREEMENT_UPDATES, QUICK_AGREEMENT_UPDATES = 200, 4
# The largest relative difference allowed between a loss of the cuda backend and the reference backend's at the same
# update (dropout off, the same batches, bf16 autocast in both): bf16 keeps 8 significant bits (a relative step of
# 2^-8 = 0.4%) and the two backends round in different places (fused kernels, chunked loss), and 200 updates of Adam
# let those differences grow; 2% is five such steps, while a wrong mask, a lost token or a wrong normaliser moves
# the loss by far more.
AGREEMENT_TOLERANCE = 0.02
PHASE_TIMEOUT = 240  # seconds one phase may take before the run moves on without it (compiles included)
TIME_BUDGET = 390  # seconds of phases (the script's whole run: 8 minutes with its tests and set-up)


def _model_configs(recipe: Config) -> list[tuple[str, Config, int]]:
    return [
        ("base", load_config(REPO / "configs" / "transformer_base.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("big", load_config(REPO / "configs" / "transformer_big.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("recipe", recipe, 0),
    ]


def _with_train(cfg: Config, **train: Any) -> Config:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


def gpu_check_plan(
    args: argparse.Namespace,
    sizes: Sizes,
    recipe: Config,
    *,
    spm: Path,
    src: Path,
    tgt: Path,
    test_src: Path,
    checkpoint: Path | None,
) -> list[dict]:
    """The phases of the GPU check in order (the module's docstring), the matmul peak first and last."""
    device = args.device
    backend = BACKEND["cuda" if device == "cuda" else "cpu"]
    matmul = {
        "kind": "matmul",
        "name": "matmul",
        "threads": args.threads,
        "n": sizes.matmul_n,
        "reps": sizes.matmul_reps,
        "device": device,
    }
    specs: list[dict] = [matmul]

    def training(name: str, base: Config, *, dtype: str, settings: dict, max_tokens: int, keep: bool = False) -> dict:
        spec = train_spec(
            name,
            _with_train(base, **settings),
            dtype=dtype,
            args=args,
            sizes=sizes,
            spm=spm,
            src=src,
            tgt=tgt,
            keep=keep,
            device=device,
            max_tokens=max_tokens,
        )
        label = "eager" if settings is EAGER else "cuda backend" + ("" if settings is backend else ", padded batches")
        return {**spec, "gpu_check": {"backend": label}}

    # the headline rows first: a run cut short by its time budget loses the least
    models = _model_configs(recipe)
    for model, base, batch_tokens in models[:2]:
        for settings in (EAGER, backend):
            label = "eager" if settings is EAGER else "backend"
            name = f"train-{model}-bf16-{label}"
            specs.append(training(name, base, dtype="bfloat16", settings=settings, max_tokens=batch_tokens))
    agreement = training("agreement-base", models[0][1], dtype="bfloat16", settings=EAGER, max_tokens=GPU_BATCH_TOKENS)
    agreement.update(
        kind="agreement",
        backend=backend,
        updates=QUICK_AGREEMENT_UPDATES if args.quick else AGREEMENT_UPDATES,
        tolerance=AGREEMENT_TOLERANCE,
    )
    recipe_rows = [
        training("train-recipe-tf32-eager", recipe, dtype="float32", settings=EAGER, max_tokens=0),
        training("train-recipe-bf16-eager", recipe, dtype="bfloat16", settings=EAGER, max_tokens=0),
        # without a trained checkpoint, this run's model is the one decoded (not representative)
        training("train-recipe-bf16-backend", recipe, dtype="bfloat16", settings=backend, max_tokens=0, keep=True),
    ]
    if checkpoint is None:  # decoding needs the recipe model trained first
        specs += recipe_rows
    ckpt = checkpoint or args.out / "runs" / "train-recipe-bf16-backend" / "checkpoint_last.pt"
    for search, beam in (("greedy", 1), ("beam5", 5)):
        for mode in ("eager", "graphed"):
            specs.append(
                translate_spec(
                    args,
                    model="recipe",
                    checkpoint=ckpt,
                    representative=checkpoint is not None,
                    search=search,
                    beam=beam,
                    test_src=test_src,
                    name=f"translate-recipe-{search}-{mode}",
                    device=device,
                    dtype="float32",
                    ops="reference" if mode == "eager" else "auto",
                    mode=mode,
                )
            )
    specs.append(agreement)
    # what packing adds to compiling: the cuda backend on the padded batches (padded to a multiple of 8)
    specs.append(
        training(
            "train-base-bf16-backend-padded",
            models[0][1],
            dtype="bfloat16",
            settings={**backend, "packed": "off"},
            max_tokens=GPU_BATCH_TOKENS,
        )
    )
    if checkpoint is not None:
        specs += recipe_rows
    for search, beam in (("greedy", 1), ("beam5", 5)):
        specs.append(
            translate_spec(
                args,
                kind="ct2-gpu",
                model="recipe",
                checkpoint=ckpt,
                representative=checkpoint is not None,
                search=search,
                beam=beam,
                test_src=test_src,
                name=f"ctranslate2-recipe-{search}",
                device=device,
            )
        )
    return [*specs, {**matmul, "name": "matmul-end"}]


# ---------------------------------------------------------------- phases
def phase_agreement(spec: dict) -> dict:
    """The first ``updates`` losses of the reference backend and of ``spec['backend']``, from the same
    initialisation over the same batches with dropout off; the largest relative difference against the tolerance."""
    losses: dict[str, list[float]] = {}
    for label, settings in (("reference", EAGER), ("backend", spec["backend"])):
        cfg = from_dict(spec["config"], source=f"benchmark {spec['name']}")
        cfg = _with_train(cfg, **settings, max_updates=spec["updates"], out_dir=f"{cfg.train.out_dir}-{label}")
        cfg.model.dropout = cfg.model.attention_dropout = cfg.model.activation_dropout = 0.0
        seen: list[float] = []

        def keep(_update: int, stats: UpdateStats, seen: list[float] = seen) -> None:
            seen.append(float(stats.loss))

        Trainer(set_up(cfg, resume=False), on_update=keep).run()
        losses[label] = seen
    pairs = list(zip(losses["reference"], losses["backend"], strict=True))
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in pairs]
    worst = max(range(len(rel)), key=rel.__getitem__)
    return {
        "updates": len(pairs),
        "max_relative_difference": rel[worst],
        "at_update": worst + 1,
        "mean_relative_difference": sum(rel) / len(rel),
        "tolerance": spec["tolerance"],
        "within_tolerance": rel[worst] <= spec["tolerance"],
        "first_losses": [list(p) for p in pairs[:3]],
        "last_losses": list(pairs[-1]),
        "all_finite": all(math.isfinite(x) for p in pairs for x in p),
    }


def phase_ct2_gpu(spec: dict) -> dict:
    """CTranslate2 on the phase's device: the checkpoint converted by tmt, one ``translate_batch`` over all lines
    through tmt's engine (tokenization and limits timed, as ``tmt translate --engine ctranslate2`` runs), at the
    checkpoint's length penalty as tmt's rows."""
    try:
        import ctranslate2  # noqa: F401 - only to say plainly when the wheel is missing

        from transformer_mt.export import ctranslate2_translator

        engine = ctranslate2_translator([spec["checkpoint"]], device=spec["device"], threads=spec["threads"])
    except (ImportError, OSError, RuntimeError, ValueError) as exc:  # the wheel absent or not running here: say so
        return {"skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
    lines = read_input(spec)
    lenpen = engine.cfg.decode.lenpen
    engine.translate_batch(lines[:8], beam=spec["beam"], lenpen=lenpen)  # warm-up
    tic = time.perf_counter()
    stats = engine.translate_batch(lines, beam=spec["beam"], lenpen=lenpen).stats
    seconds = time.perf_counter() - tic
    return {
        "sentences": len(lines),
        "seconds": seconds,
        "target_tokens": stats.tgt_tokens,
        "sentences_per_s": len(lines) / seconds,
        "tokens_per_s": stats.tgt_tokens / seconds,
    }


# ---------------------------------------------------------------- the table
COLUMNS = [
    "phase",
    "dtype",
    "setting",
    "tokens/s",
    "sentences/s",
    "MFU % (measured peak)",
    "MFU % (datasheet)",
    "peak GPU MiB",
    "compiles / breaks",
    "notes",
]


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def mfu(res: dict, peak_flops: float) -> float | None:
    """6 x parameters x target tokens/s over ``peak_flops``, in percent."""
    if "parameters" not in res or not peak_flops:
        return None
    return 100 * 6 * res["parameters"] * res["tokens_per_s"] / peak_flops


def table_rows(phases: list[tuple[dict, dict]], *, measured_peak: float, datasheet_peak: float) -> list[list[str]]:
    """One row per phase (the matmul peaks are in the header)."""
    rows = []
    for spec, res in phases:
        name, kind = spec["name"], spec["kind"]
        if "failed" in res:
            rows.append([name, "", "", "", "", "", "", "", "", f"failed: {res['failed']}"])
        elif kind == "train":
            dtype = "bf16" if spec["config"]["train"]["dtype"] == "bfloat16" else "TF32"
            rows.append(
                [
                    name,
                    dtype,
                    spec["gpu_check"]["backend"],
                    _fmt(res["tokens_per_s"], ",.0f"),
                    "",
                    _fmt(mfu(res, measured_peak), ".1f"),
                    _fmt(mfu(res, datasheet_peak), ".1f"),
                    _fmt(res.get("gpu_peak_memory_mib"), ",.0f"),
                    f"{res.get('compiled_graphs', 0)} / {res.get('graph_breaks', 0)}",
                    f"padding {res['target_padding_fraction']:.0%} of target slots",
                ]
            )
        elif kind == "agreement":
            verdict = "within" if res["within_tolerance"] else "OUTSIDE"
            rows.append(
                [
                    name,
                    "bf16",
                    "cuda backend vs reference",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    f"{res['updates']} losses: max relative difference {res['max_relative_difference']:.2e} at "
                    f"update {res['at_update']}, {verdict} {res['tolerance']:g}",
                ]
            )
        elif "skipped" in res:
            rows.append([name, "", "", "", "", "", "", "", "", f"skipped: {res['skipped']}"])
        else:  # translate, ct2-gpu
            setting = spec.get("mode", "CTranslate2")
            rows.append(
                [
                    name,
                    spec.get("dtype", "float32"),
                    setting,
                    _fmt(res["tokens_per_s"], ",.0f"),
                    _fmt(res["sentences_per_s"], ",.1f"),
                    "",
                    "",
                    "",
                    "",
                    f"{res['sentences']} lines"
                    + ("" if spec["representative"] else ", barely trained model")
                    + _graph_note(res.get("graphs")),
                ]
            )
    return rows


def _graph_note(stats: dict | None) -> str:
    """What the graphed search did: captures, replays, steps run eagerly on its buffers, batches outside them."""
    if not stats:
        return ""
    return (
        f"; {stats['captures']} captures, {stats['replays']} replays, {stats['eager_replays']} eager steps, "
        f"{stats['eager_batches']} batches outside the buckets"
    )


def render_table(report: dict) -> str:
    """The GPU check's one table, with the machine and the peaks above it."""
    head = report["header"]
    lines = [
        f"GPU check {head['date']}: {head['gpu']}, torch {head['torch']}, CUDA {head['cuda']}; "
        f"bf16 matmul peak measured {head['measured_peak_tflops']:.4g} TFLOP/s, datasheet "
        f"{head['datasheet_peak_tflops']:.4g} TFLOP/s ({head['datasheet_source']}); "
        f"{head['warmup']} untimed + {head['updates']} timed updates per training row.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in report["rows"]]
    if report.get("cuda_tests"):
        lines += ["", f"cuda-marked tests: {report['cuda_tests']}"]
    return "\n".join(lines) + "\n"


def header(args: argparse.Namespace, sizes: Sizes, *, measured_gflops: float, datasheet: tuple[float, str]) -> dict:
    cuda = torch.cuda.is_available()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name() if cuda else "no GPU (the plan run on a CPU)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "measured_peak_tflops": measured_gflops / 1e3,
        "datasheet_peak_tflops": datasheet[0] / 1e12,
        "datasheet_source": datasheet[1],
        "warmup": args.warmup if args.warmup is not None else sizes.warmup,
        "updates": args.updates if args.updates is not None else sizes.updates,
    }
