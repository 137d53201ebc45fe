#!/usr/bin/env python
"""Where a training update's time goes: torch.profiler over `tmt train`'s own loop.

    python scripts/profile_train.py [--model reference|recipe] [--warmup 20] [--updates 30] [--threads 2]
                                    [--set section.key=value ...] [--out prof] [--trace]

Trains through :class:`transformer_mt.training.Trainer` (its ``on_update`` hook starts the profiler after
``--warmup`` updates and stops it after ``--updates`` more) on the real Multi30k batches, then prints one
table: the operators by self CPU time, grouped by kind (matmuls, attention, element-wise passes,
LayerNorm, dropout, softmax/loss, embedding, optimizer step, the rest), each as a share of the profiled
wall time; "outside operators" is wall time no aten operator accounts for (Python, collation, the data
loader, the profiler's own cost). The top operators follow.

Models: ``reference`` is configs/multi30k_reference.yaml with REFERENCE below (3+3 layers, d_model 256,
d_ff 1024, 4 heads, post-norm, dropout 0.1, no activation dropout, 4,096-token batches, inverse_sqrt
warm-up 1,000, lr 5e-4, fp32); ``recipe`` is configs/multi30k_en_de.yaml. ``--set`` overrides either.
The profiler costs a few per cent of the step; compare shares before and after a change, not absolute
times with the benchmark's.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_mt.config import load_config
from transformer_mt.training import Trainer, UpdateStats, set_up

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = [
    "model.norm=post",
    "model.dropout=0.1",
    "model.activation_dropout=0.0",
    "train.max_tokens=4096",
    "train.lr=5e-4",
    "train.warmup_updates=1000",
]
# Operator name -> group. The first matching prefix wins; everything unmatched is "other ops".
GROUPS = (
    (
        "matmul",
        (
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::linear",
            "mkldnn::_linear_pointwise",
        ),
    ),
    ("attention (SDPA)", ("aten::_scaled_dot_product", "aten::scaled_dot_product", "tmt::short_attention")),
    ("layer norm", ("aten::native_layer_norm", "aten::layer_norm", "tmt::scale_norm")),
    (
        "dropout",
        (
            "aten::native_dropout",
            "aten::dropout",
            "aten::bernoulli",
            "aten::uniform_",
            "aten::rand",
            "aten::random_",
            "tmt::dropout",
        ),
    ),
    (
        "softmax / loss",
        (
            "aten::_log_softmax",
            "aten::log_softmax",
            "aten::_softmax",
            "aten::softmax",
            "aten::nll_loss",
            "aten::gather",
            "aten::scatter",
            "tmt::softmax_rows",
        ),
    ),
    ("embedding", ("aten::embedding", "aten::index_select", "aten::index_add", "aten::embedding_dense_backward")),
    ("optimizer", ("aten::_fused_adam", "aten::_foreach", "Optimizer.step")),
    (
        "element-wise",
        (
            "aten::add",
            "aten::mul",
            "aten::div",
            "aten::sub",
            "aten::relu",
            "aten::threshold",
            "aten::gelu",
            "aten::where",
            "aten::masked_fill",
            "aten::copy_",
            "aten::clone",
            "aten::fill_",
            "aten::zero_",
            "aten::sum",
            "aten::mean",
            "aten::sqrt",
            "aten::rsqrt",
            "aten::pow",
            "aten::neg",
            "aten::exp",
            "aten::lerp",
            "aten::addcmul",
            "aten::addcdiv",
            "aten::to",
            "aten::_to_copy",
            "aten::cat",
            "aten::eq",
            "aten::ne",
        ),
    ),
)


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return "other ops"


def build_config(model: str, overrides: list[str], *, out: Path, threads: int, total: int):
    path = ROOT / "configs" / ("multi30k_reference.yaml" if model == "reference" else "multi30k_en_de.yaml")
    base = REFERENCE if model == "reference" else []
    run = [
        f"train.out_dir={out / ('run-' + model)}",
        f"train.threads={threads}",
        f"train.max_updates={total}",
        "train.max_time=0",
        "train.max_epochs=0",
        f"train.validate_every={total + 1}",
        "train.save_every=0",
        "train.keep_last=1",
        f"train.log_every={total + 1}",
        "train.valid_bleu_sentences=-1",
        "train.dtype=float32",
    ]
    return load_config(path, base + run + overrides)


def leaf_self_times(prof) -> dict[str, float]:
    """Self CPU microseconds per operator name, over the profiled window."""
    times: dict[str, float] = collections.defaultdict(float)
    for evt in prof.key_averages():
        times[evt.key] += evt.self_cpu_time_total
    return dict(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("reference", "recipe"), default="reference")
    p.add_argument("--warmup", type=int, default=20, help="untimed updates before the profiler starts")
    p.add_argument("--updates", type=int, default=30, help="profiled updates")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override section.key=value (repeatable)"
    )
    p.add_argument("--out", type=Path, default=Path("prof"))
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace (<out>/<model>.trace.json)")
    p.add_argument("--top", type=int, default=15, help="operators listed")
    return p.parse_args(argv)


def profile_updates(cfg, *, warmup: int, total: int) -> tuple[profile, float, int]:
    """(profiler, wall microseconds, target tokens) of updates warmup+1..total of ``tmt train``'s loop on ``cfg``."""
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    prof = profile(activities=[ProfilerActivity.CPU])
    marks, tokens = {}, []

    def on_update(update: int, stats: UpdateStats) -> None:
        if update == warmup:
            marks["start"] = time.perf_counter()
            prof.start()
        elif update > warmup:
            tokens.append(stats.tokens)
            if update == total:
                prof.stop()
                marks["stop"] = time.perf_counter()

    Trainer(set_up(cfg, resume=False), on_update=on_update).run()
    return prof, (marks["stop"] - marks["start"]) * 1e6, sum(tokens)


def print_tables(
    args: argparse.Namespace, rows: list[tuple[str, float]], times: dict[str, float], *, wall_us: float, ntok: int
) -> None:
    print(
        f"# {args.model}: {args.updates} updates profiled after {args.warmup}, {ntok} target tokens, "
        f"{wall_us / 1e3 / args.updates:.1f} ms per update, "
        f"{ntok / (wall_us / 1e6):.0f} target tokens/s (under the profiler), "
        f"torch {torch.__version__}, {args.threads} threads"
    )
    print("\n| group | ms per update | share of wall |\n| --- | ---: | ---: |")
    for group, us in rows:
        print(f"| {group} | {us / 1e3 / args.updates:.2f} | {us / wall_us:.1%} |")
    print("\n| top operators (self CPU) | ms per update | share of wall |\n| --- | ---: | ---: |")
    for name, us in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {name} | {us / 1e3 / args.updates:.2f} | {us / wall_us:.1%} |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    total = args.warmup + args.updates
    cfg = build_config(args.model, args.overrides, out=args.out, threads=args.threads, total=total)
    prof, wall_us, ntok = profile_updates(cfg, warmup=args.warmup, total=total)
    times = leaf_self_times(prof)
    grouped: dict[str, float] = collections.defaultdict(float)
    for name, us in times.items():
        grouped[group_of(name)] += us
    accounted = sum(grouped.values())
    # Self times of all threads add up; with intra-op threads the ops' self time is the calling thread's.
    rows = sorted(grouped.items(), key=lambda kv: -kv[1]) + [("outside operators", max(0.0, wall_us - accounted))]
    print_tables(args, rows, times, wall_us=wall_us, ntok=ntok)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "model": args.model,
        "updates": args.updates,
        "wall_us": wall_us,
        "target_tokens": ntok,
        "groups": dict(rows),
        "ops": times,
    }
    (args.out / f"{args.model}.profile.json").write_text(json.dumps(report, indent=1))
    if args.trace:
        prof.export_chrome_trace(str(args.out / f"{args.model}.trace.json"))
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
