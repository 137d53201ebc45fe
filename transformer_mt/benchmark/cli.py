"""The benchmark's command line (``python -m transformer_mt.benchmark``, ``scripts/benchmark.py``): parse, prepare
the data, run the plan, write the report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from transformer_mt.benchmark import peer
from transformer_mt.benchmark.gpu_check import PHASE_TIMEOUT, TIME_BUDGET, gpu_check_plan, render_table, table_rows
from transformer_mt.benchmark.gpu_check import header as gpu_check_header
from transformer_mt.benchmark.markdown import render_markdown
from transformer_mt.benchmark.plan import cpu_plan, ctranslate2_specs, cuda_plan
from transformer_mt.benchmark.report import Where, cpu_report, cuda_report
from transformer_mt.benchmark.runner import run_each, run_phase, run_phase_file, run_specs
from transformer_mt.benchmark.settings import (
    FALLBACK_CONFIG,
    FULL,
    QUICK,
    RECIPE_CONFIG,
    REFERENCE_VOCAB,
    REPO,
    Sizes,
    gpu_bf16_peak,
    sizes_for,
)
from transformer_mt.benchmark.specs import prepare_data
from transformer_mt.config import Config, load_config

DESCRIPTION = "Benchmark transformer_mt on this machine; writes <out>/benchmark.json and <out>/benchmark.md."


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options; ``prog`` names the command in the usage line (default: the script's file name)."""
    p = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config",
        type=Path,
        default=RECIPE_CONFIG,
        help="recipe config (default configs/multi30k_en_de.yaml, else multi30k_small.yaml)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="Multi30k directory (default ../shared/data/multi30k beside the repo, else data/multi30k)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("bench"), help="output directory; also holds the cached tokenizer and corpus"
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads in every phase")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help=f"untimed updates per training run (default {FULL.warmup}, quick {QUICK.warmup})",
    )
    p.add_argument(
        "--updates",
        type=int,
        default=None,
        help=f"timed updates per training run (default {FULL.updates}, quick {QUICK.updates})",
    )
    p.add_argument("--sentences", type=int, default=None, help="test sentences translated (default all 1000, quick 20)")
    p.add_argument(
        "--checkpoint", type=Path, default=None, help="the trained recipe model: its translation speed is timed too"
    )
    p.add_argument(
        "--reference-checkpoint",
        type=Path,
        default=None,
        help="a trained 3+3/d256 model, the size of the quoted fairseq beam-5 figure "
        "(else the benchmark's barely trained one)",
    )
    p.add_argument(
        "--ctranslate2",
        action="store_true",
        help="also decode each translated checkpoint with CTranslate2 (needs the export extra)",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny models and sizes, seconds: checks the script, measures nothing"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU plan (base and big at 25k-token batches, bf16 and fp32+TF32, the recipe; "
        "MFU, peak GPU memory)",
    )
    p.add_argument(
        "--compile", action="store_true", help="--device cuda: also train base and big in bf16 with torch.compile"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="--device cuda: the bf16 dense peak for MFU (default: datasheet table)",
    )
    p.add_argument(
        "--gpu-check",
        action="store_true",
        help="scripts/gpu_check.sh's plan: eager against the cuda backend, loss agreement, graphed decoding and "
        "CTranslate2, one table (with --device cpu --quick: the plan proved on a CPU)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=TIME_BUDGET,
        help="--gpu-check: seconds of phases; those that would start later are listed as not run",
    )
    p.add_argument(
        "--cuda-tests", type=Path, default=None, help="--gpu-check: a file whose last line sums up the cuda tests"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the phases as JSON and exit: nothing is trained, measured or put on a GPU",
    )
    peer.add_arguments(p)  # --peer, --fairseq-env, --peer-updates, --only
    p.add_argument("--phase", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run one phase's spec
    return p


def parse_args(argv: list[str] | None, *, prog: str | None = None) -> argparse.Namespace:
    """The options with their defaults filled in (per --quick and --device); a bad combination exits with the
    usage line."""
    p = build_parser(prog)
    args = p.parse_args(argv)
    sizes = sizes_for(device=args.device, quick=args.quick)
    args.warmup = sizes.warmup if args.warmup is None else args.warmup
    args.updates = sizes.updates if args.updates is None else args.updates
    args.sentences = sizes.sentences if args.sentences is None else args.sentences
    if args.data is None:
        shared = REPO.parent / "shared" / "data" / "multi30k"
        args.data = shared if shared.is_dir() else REPO / "data" / "multi30k"
    if args.gpu_check and (args.compile or args.ctranslate2 or args.peer or args.reference_checkpoint):
        p.error("--gpu-check runs its own plan; leave out --compile, --ctranslate2, --peer and --reference-checkpoint")
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
    peer.check_arguments(p, args)
    return args


def dry_run(args: argparse.Namespace) -> list[dict]:
    """The phases the run would take, in order, with placeholder data paths (nothing prepared or run)."""
    recipe = load_config(args.config if args.config.is_file() else FALLBACK_CONFIG, check_files=False)
    sizes, data = sizes_for(device=args.device, quick=args.quick), args.out / "<prepared>"
    paths = dict(
        spm=data / "spm.model", src=data / "train.en", tgt=data / "train.de", test_src=args.data / "test_2016_flickr.en"
    )
    if args.device == "cuda":
        return cuda_plan(args, sizes, recipe, **paths)
    raise SystemExit(
        "benchmark: --dry-run lists the --device cuda plan; "
        "the CPU plan is in the transformer_mt.benchmark package's docstring"
    )


def recipe_config(args: argparse.Namespace) -> tuple[Path, str, Config]:
    """(path, note, config) of the recipe model: --config, or multi30k_small.yaml when the default recipe is
    absent."""
    config, note = args.config, ""
    if not config.is_file() and config.resolve() == RECIPE_CONFIG:
        config, note = (
            FALLBACK_CONFIG,
            f"{RECIPE_CONFIG.relative_to(REPO)} not found: recipe model from {FALLBACK_CONFIG.relative_to(REPO)}",
        )
        print(f"benchmark: {note}", file=sys.stderr)
    return config, note, load_config(config, check_files=False)


def run_all(args: argparse.Namespace) -> dict:
    """Prepare the data, run every phase of the plan, and return the report (benchmark.json's content)."""
    sizes = sizes_for(device=args.device, quick=args.quick)
    config, note, recipe = recipe_config(args)
    test_src = args.data / "test_2016_flickr.en"
    for path in (args.data / "train.en", args.data / "train.de", test_src):
        if not path.is_file():
            raise SystemExit(
                f"benchmark: {path} not found; pass --data DIR holding Multi30k "
                "(scripts/prepare_multi30k.sh downloads it)"
            )
    load_start = os.getloadavg()
    spm, src, tgt = prepare_data(args, recipe, sizes, sizes.spm_vocab or recipe.tokenizer.vocab_size)
    where = Where(config=config, note=note, spm=spm, test_src=test_src)
    if args.gpu_check:
        return run_gpu_check(args, sizes, recipe, spm=spm, src=src, tgt=tgt, test_src=test_src)
    if args.device == "cuda":
        matmul, phases = run_specs(
            cuda_plan(args, sizes, recipe, spm=spm, src=src, tgt=tgt, test_src=test_src), args.out
        )
        gpu = next(
            (res["gpu"] for _, res in phases if "gpu" in res),
            torch.cuda.get_device_name() if torch.cuda.is_available() else "?",
        )
        peak = gpu_bf16_peak(gpu, matmul["bfloat16"]["gflops"], args.peak_tflops)
        return cuda_report(args, where, load_start=load_start, matmul=matmul, phases=phases, gpu=gpu, peak=peak)
    ref_spm = prepare_data(args, recipe, sizes, sizes.spm_vocab or REFERENCE_VOCAB)[0]
    matmul, phases = run_specs(
        cpu_plan(args, sizes, recipe, spm=spm, ref_spm=ref_spm, src=src, tgt=tgt, test_src=test_src), args.out
    )
    ct2 = run_each(ctranslate2_specs(args, test_src), args.out, label="ctranslate2") if args.ctranslate2 else []
    return cpu_report(args, where, load_start=load_start, matmul=matmul, phases=phases, ct2_phases=ct2)


def run_gpu_check(
    args: argparse.Namespace, sizes: Sizes, recipe: Config, *, spm: Path, src: Path, tgt: Path, test_src: Path
) -> dict:
    """scripts/gpu_check.sh's run (transformer_mt.benchmark.gpu_check): every phase, none ending the run."""
    specs = gpu_check_plan(
        args, sizes, recipe, spm=spm, src=src, tgt=tgt, test_src=test_src, checkpoint=args.checkpoint
    )
    deadline = time.monotonic() + args.time_budget
    results: list[dict] = []
    for i, spec in enumerate(specs, 1):
        left = deadline - time.monotonic()
        if left < 5 and i < len(specs):  # the last phase, the matmul peak again, takes seconds and always runs
            results.append({"failed": "not run: the time budget (--time-budget) was spent"})
            continue
        step = f"[{i}/{len(specs)}]"
        results.append(run_phase(spec, args.out, step=step, timeout=min(PHASE_TIMEOUT, max(left, 30)), tolerant=True))
    peaks = [float(r["bfloat16"]["gflops"]) for r in (results[0], results[-1]) if "bfloat16" in r]
    measured = max(peaks, default=0.0)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    datasheet = gpu_bf16_peak(gpu, measured, args.peak_tflops)
    phases = list(zip(specs[1:-1], results[1:-1], strict=True))
    cuda_tests = ""
    if args.cuda_tests is not None and args.cuda_tests.is_file():
        cuda_tests = (args.cuda_tests.read_text(encoding="utf-8").strip().splitlines() or [""])[-1]
    return {
        "schema": "transformer_mt.benchmark.gpu_check/1",
        "header": gpu_check_header(args, sizes, measured_gflops=measured, datasheet=datasheet),
        "rows": table_rows(phases, measured_peak=measured * 1e9, datasheet_peak=datasheet[0]),
        "phases": [{"spec": spec, "result": res} for spec, res in phases],
        "matmul": results[0],
        "cuda_tests": cuda_tests,
    }


def main(argv: list[str] | None = None, *, prog: str | None = None) -> None:
    """Run the benchmark (or, with the internal ``--phase SPEC.json``, one phase of it) and write its report."""
    args = parse_args(argv, prog=prog)
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
    report = run_all(args)
    (args.out / "benchmark.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.gpu_check:
        markdown = render_table(report)
    elif args.only == "peer":
        markdown = peer.render(report).lstrip()
    else:
        markdown = render_markdown(report) + peer.render(report)
    (args.out / "benchmark.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"benchmark: wrote {args.out / 'benchmark.json'} and {args.out / 'benchmark.md'}", file=sys.stderr)
