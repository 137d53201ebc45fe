#!/usr/bin/env python
"""Where a search step's time goes, how fast tmt's own search translates, and whether its outputs changed.

    python scripts/profile_decode.py speed   CHECKPOINT [--beams 1 5] [--single 100] [--repeat 3]
    python scripts/profile_decode.py profile CHECKPOINT [--beams 1 5] [--single 50] [--top 15]
    python scripts/profile_decode.py outputs CHECKPOINT --save FILE | --check FILE

Decodes the lines of ``--lines`` (default: the Multi30k test_2016_flickr English side) with
:class:`transformer_mt.decoding.Translator` on CPU in float32, ``--threads`` threads, length penalty 0 and
the checkpoint's ``decode.batch_tokens`` (``speed``, ``profile``), as ``tmt translate`` does:

- ``speed``: per beam, sentences/s and target tokens/s of the whole file in one ``translate_batch`` call
  (best of ``--repeat``), and the median (p50) latency of ``--single`` lines translated one at a time;
- ``profile``: the operators' self CPU time under torch.profiler, grouped by kind (matmuls, attention,
  norms, element-wise, cache reorders and gathers, softmax / top-k, the rest), each as a share of the
  wall time, for the batched file and for ``--single`` one-line calls; "outside operators" is wall time no
  aten operator accounts for (Python, dispatch, tokenisation, the profiler's own cost);
- ``outputs``: greedy and beam 5 hypotheses (token ids, score, log-prob) of every line at length penalty
  0 and at the checkpoint's, plus the 5-best of the first ``--nbest-lines`` lines, written as JSON
  (``--save``) or compared with such a file (``--check``): the counts of identical hypotheses and the
  largest score difference; exits 1 when any differs.

The package is imported from ``sys.path``, so ``PYTHONPATH=OTHER_TREE`` measures another checkout with this
same script (side-by-side timings in one locked command).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from transformer_mt.decoding import Translator, translate_ids

ROOT = Path(__file__).resolve().parent.parent
LINES = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en"
# Operator name -> group. The first matching prefix wins; everything unmatched is "other ops".
GROUPS = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")),
    ("attention (SDPA)", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
    ("norms", ("aten::norm", "aten::linalg_vector_norm", "aten::clamp", "aten::clamp_min", "aten::native_layer_norm")),
    (
        "softmax / top-k",
        ("aten::_log_softmax", "aten::log_softmax", "aten::topk", "aten::max", "aten::sort", "aten::argsort"),
    ),
    (
        "reorder / gather",
        ("aten::index_select", "aten::index", "aten::index_put", "aten::index_copy", "aten::gather", "aten::embedding"),
    ),
    (
        "element-wise",
        ("aten::add", "aten::mul", "aten::div", "aten::sub", "aten::relu", "aten::where", "aten::copy_", "aten::fill_"),
    ),
    (
        "allocation / views",
        ("aten::empty", "aten::new_", "aten::full", "aten::zeros", "aten::clone", "aten::cat", "aten::stack"),
    ),
)


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return "other ops"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("speed", "profile", "outputs"))
    p.add_argument("checkpoint")
    p.add_argument("--lines", type=Path, default=LINES, help="source lines (default: Multi30k test_2016_flickr.en)")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    p.add_argument("--single", type=int, default=100, help="lines translated one at a time for the latency")
    p.add_argument("--repeat", type=int, default=3, help="timed passes over the file (the best counts)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=15, help="operators listed by profile")
    p.add_argument("--nbest-lines", type=int, default=100, help="lines whose 5-best lists outputs records")
    p.add_argument("--save", type=Path, help="outputs: write the hypotheses here")
    p.add_argument("--check", type=Path, help="outputs: compare with hypotheses written by --save")
    return p.parse_args(argv)


def speed(tr: Translator, lines: list[str], args: argparse.Namespace) -> None:
    for beam in args.beams:
        tr.translate_batch(lines[:8], beam=beam, lenpen=0.0)  # warm-up: allocator, thread pool
        best, tokens = float("inf"), 0
        for _ in range(args.repeat):
            tic = time.perf_counter()
            r = tr.translate_batch(lines, beam=beam, lenpen=0.0)
            best, tokens = min(best, time.perf_counter() - tic), r.stats.tgt_tokens
        lat = []
        for line in lines[: args.single]:
            tic = time.perf_counter()
            tr.translate_batch([line], beam=beam, lenpen=0.0)
            lat.append(time.perf_counter() - tic)
        print(
            f"beam {beam}: {len(lines) / best:.1f} sentences/s, {tokens / best:.0f} target tokens/s; "
            f"one at a time p50 {statistics.median(lat) * 1e3:.1f} ms",
            flush=True,
        )


def profile_table(tr: Translator, batches: list[list[str]], *, beam: int, title: str, top: int) -> None:
    tr.translate_batch(batches[0][:8], beam=beam, lenpen=0.0)
    prof = profile(activities=[ProfilerActivity.CPU])
    tic = time.perf_counter()
    with prof:
        for batch in batches:
            tr.translate_batch(batch, beam=beam, lenpen=0.0)
    wall = (time.perf_counter() - tic) * 1e6
    times: dict[str, float] = collections.defaultdict(float)
    for evt in prof.key_averages():
        times[evt.key] += evt.self_cpu_time_total
    grouped: dict[str, float] = collections.defaultdict(float)
    for name, us in times.items():
        grouped[group_of(name)] += us
    rows = sorted(grouped.items(), key=lambda kv: -kv[1]) + [
        ("outside operators", max(0.0, wall - sum(grouped.values())))
    ]
    print(f"\n# {title}, beam {beam}: {wall / 1e3:.0f} ms under the profiler")
    print("\n| group | ms | share of wall |\n| --- | ---: | ---: |")
    for group, us in rows:
        print(f"| {group} | {us / 1e3:.1f} | {us / wall:.1%} |")
    print("\n| top operators (self CPU) | calls | ms | share of wall |\n| --- | ---: | ---: | ---: |")
    counts = {evt.key: evt.count for evt in prof.key_averages()}
    for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {name} | {counts[name]} | {us / 1e3:.1f} | {us / wall:.1%} |")


def hypotheses(tr: Translator, lines: list[str], args: argparse.Namespace) -> dict[str, list]:
    """Every decoding the outputs check covers: name -> per line, a list of [tokens, score, logprob]."""
    ids = tr.src_tok.encode(lines)
    d = tr.cfg.decode
    out = {}
    runs = [(beam, lenpen, 1, len(ids)) for beam in (1, 5) for lenpen in sorted({0.0, d.lenpen})] + [
        (5, d.lenpen, 5, args.nbest_lines)
    ]
    for beam, lenpen, nbest, n in runs:
        lengths = {"max_len_a": d.max_len_a, "max_len_b": d.max_len_b}
        hyps = translate_ids(
            tr.model, ids[:n], beam=beam, lenpen=lenpen, nbest=nbest, batch_tokens=d.batch_tokens, **lengths
        )
        out[f"beam{beam}-lenpen{lenpen:g}-nbest{nbest}"] = [[[h.tokens, h.score, h.logprob] for h in nb] for nb in hyps]
    return out


def compare(new: dict[str, list], old: dict[str, list]) -> bool:
    same_everywhere = True
    for name, lists in old.items():
        got = new[name]
        same = sum(all(a[0] == b[0] for a, b in zip(x, y)) and len(x) == len(y) for x, y in zip(got, lists))
        diff = max(abs(a[i] - b[i]) for x, y in zip(got, lists) for a, b in zip(x, y) for i in (1, 2))
        print(
            f"{name}: {same}/{len(lists)} lines with identical hypotheses, "
            f"largest score / log-prob difference {diff:.2e}"
        )
        same_everywhere &= same == len(lists)
    return same_everywhere


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    lines = args.lines.read_text(encoding="utf-8").splitlines()
    tr = Translator.from_checkpoint(args.checkpoint, device="cpu", dtype="float32", threads=args.threads)
    if args.mode == "speed":
        speed(tr, lines, args)
    elif args.mode == "profile":
        for beam in args.beams:
            profile_table(tr, [lines], beam=beam, title=f"{len(lines)} lines in one call", top=args.top)
            profile_table(
                tr,
                [[line] for line in lines[: args.single]],
                beam=beam,
                title=f"{args.single} lines one at a time",
                top=args.top,
            )
    else:
        if (args.save is None) == (args.check is None):
            sys.exit("outputs needs exactly one of --save FILE, --check FILE")
        with torch.inference_mode():
            got = hypotheses(tr, lines, args)
        if args.save:
            args.save.write_text(json.dumps(got))
        elif not compare(got, json.loads(args.check.read_text())):
            sys.exit(1)


if __name__ == "__main__":
    main()
