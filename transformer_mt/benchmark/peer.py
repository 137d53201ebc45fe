"""fairseq beside tmt in one benchmark run: ``python -m transformer_mt.benchmark --peer fairseq [--only peer]``.

A ratio between the two toolkits means something only from one machine and one run, so the benchmark
trains both on the same config (:mod:`transformer_mt.benchmark.fairseq_side`) one after the other, each in its own
process with the same threads:

  timing     target tokens (non-pad, EOS included) per second over updates FIRST+1 .. LAST (``--peer-updates``,
             default 40 160): tmt by the benchmark's train phase (the window from the end of update FIRST to the end
             of update LAST); fairseq from its per-update JSON log (``--log-format json --log-interval 1``): the
             train_inner line of update u gives wpb_u (its target tokens) and wps_u (wpb_u over the wall time since
             the previous line: fairseq resets its meters after each line), so its time is wpb_u / wps_u and
             tokens/s = sum wpb_u / sum (wpb_u / wps_u). As a cross-check the parent also stamps each line as it
             arrives (``wall_tokens_per_s``: sum wpb_u over the time from line FIRST to line LAST).
             No validation and no checkpoint is written on either side (fairseq ``--disable-validation --no-save``).
  FLOPs      per target token as the benchmark measures them for tmt (FlopCounterMode on tmt's model and batches);
             the same count is applied to fairseq's tokens/s, the model and the batches being the same up to padding.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from transformer_mt.benchmark.fairseq_side import (
    ENV_SCRIPT,
    PEER_CONFIG,
    PEER_OVERRIDES,
    PeerError,
    clean_env,
    peer_config,
    prepare,
    require_env,
    train_command,
)
from transformer_mt.benchmark.settings import REPO, Sizes
from transformer_mt.benchmark.specs import train_spec
from transformer_mt.config import from_dict

WINDOW, QUICK_WINDOW = (40, 160), (2, 6)  # (FIRST, LAST) of --peer-updates


# ---------------------------------------------------------------- options (added to the benchmark's parser)
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peer",
        choices=("fairseq",),
        default=None,
        help="also train fairseq on the reference config in this run and report the ratio",
    )
    p.add_argument(
        "--fairseq-env",
        type=Path,
        default=None,
        help=f"fairseq side environment (default $FAIRSEQ_ENV, else .venv-fairseq; {ENV_SCRIPT} makes it)",
    )
    p.add_argument(
        "--peer-updates",
        type=int,
        nargs=2,
        metavar=("FIRST", "LAST"),
        default=None,
        help=f"timed updates FIRST+1..LAST of both peer runs "
        f"(default {WINDOW[0]} {WINDOW[1]}, quick {QUICK_WINDOW[0]} {QUICK_WINDOW[1]})",
    )
    p.add_argument(
        "--only",
        choices=("peer",),
        default=None,
        help="peer: only the matmul peak and the two peer runs (needs --peer)",
    )


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults and conflicts of the peer options; parser errors exit with the usage line."""
    if args.peer_updates is None:
        args.peer_updates = list(QUICK_WINDOW if args.quick else WINDOW)
    first, last = args.peer_updates
    if not 1 <= first < last:
        p.error(
            f"--peer-updates {first} {last}: need 1 <= FIRST < LAST (FIRST untimed updates, then LAST - FIRST timed)"
        )
    if args.only and not args.peer:
        p.error("--only peer needs --peer fairseq")
    if args.peer and args.device != "cpu":
        p.error("--peer fairseq is a CPU comparison (fairseq-train --cpu); leave out --device cuda")
    if args.only and (args.checkpoint or args.reference_checkpoint or args.ctranslate2):
        p.error(
            "--only peer trains and times only the peer runs; "
            "leave out --checkpoint, --reference-checkpoint and --ctranslate2"
        )
    if args.peer:
        try:
            args.fairseq_env = require_env(args.fairseq_env)
        except PeerError as exc:  # before any work: one line, the CLI's exit code for a user error
            p.exit(2, f"benchmark: error: {exc}\n")


# ---------------------------------------------------------------- fairseq's run and its log
def parse_train_log(lines: Iterable[tuple[float, str]], *, first: int, last: int) -> dict:
    """Tokens/s of updates first+1..last from fairseq-train's JSON log, ``lines`` as (arrival seconds, text).

    Returns target_tokens (sum of wpb), seconds (sum of wpb / wps: fairseq's own per-update time), tokens_per_s,
    wall_seconds and wall_tokens_per_s (from the arrival of update first's line to update last's), updates, and
    dictionary_size (from "[lang] dictionary: N types", if logged)."""
    updates: dict[int, tuple[float, float, float]] = {}  # update -> (arrival, wpb, wps)
    dictionary = {}
    for stamp, text in lines:
        if "| train_inner | " in text:
            rec = json.loads(text.split("| train_inner | ", 1)[1])
            updates[int(rec["num_updates"])] = (stamp, float(rec["wpb"]), float(rec["wps"]))
        elif m := re.search(r"\[(\w+)\] dictionary: (\d+) types", text):
            dictionary[m.group(1)] = int(m.group(2))
    missing = [u for u in range(first, last + 1) if u not in updates]
    if missing:
        raise PeerError(
            f"fairseq's log has no train_inner line for update {missing[0]} (of {first}..{last}); it needs "
            "--log-format json --log-interval 1 and --max-update >= the last update"
        )
    window = [updates[u] for u in range(first + 1, last + 1)]
    if any(wps <= 0 for _, _, wps in window):
        raise PeerError(
            f"fairseq's log gives wps 0 for an update in {first + 1}..{last}: its meters were not running; "
            "time later updates"
        )
    tokens = sum(wpb for _, wpb, _ in window)
    seconds = sum(wpb / wps for _, wpb, wps in window)
    wall = updates[last][0] - updates[first][0]
    sizes = set(dictionary.values())
    return {
        "updates": last - first,
        "target_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "wall_seconds": wall,
        "wall_tokens_per_s": tokens / wall if wall > 0 else None,
        "dictionary_size": sizes.pop() if len(sizes) == 1 else None,
    }


def phase_fairseq(spec: dict) -> dict:
    """The ``fairseq`` phase: run fairseq-train, stamp its lines as they arrive, parse the window."""
    shutil.rmtree(spec["save_dir"], ignore_errors=True)
    log_path, lines = Path(spec["result"]).parent / f"{spec['name']}.fairseq.log", []
    load_start = os.getloadavg()
    with (
        open(log_path, "w", encoding="utf-8") as log,
        subprocess.Popen(
            spec["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(spec["threads"])
        ) as proc,
    ):
        assert proc.stdout is not None  # stdout=PIPE
        for text in proc.stdout:
            lines.append((time.perf_counter(), text.rstrip("\n")))
            log.write(text)
    if proc.returncode != 0:
        tail = "\n".join(t for _, t in lines[-15:])
        raise PeerError(f"fairseq-train failed (exit {proc.returncode}); {log_path} ends with:\n{tail}")
    out = parse_train_log(lines, first=spec["first"], last=spec["last"])
    version = subprocess.run(
        [str(Path(spec["command"][0]).with_name("python")), "-c", "import fairseq; print(fairseq.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    shutil.rmtree(spec["save_dir"], ignore_errors=True)
    return {
        **out,
        "fairseq_version": version,
        "log": str(log_path),
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        # the largest waited-for child's
        "fairseq_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


# ---------------------------------------------------------------- plan and report (the parent side)
def plan(args: argparse.Namespace, sizes: Sizes, *, spm: Path, src: Path, tgt: Path) -> list[dict]:
    """The two peer phases, tmt first: the benchmark's train phase on the peer config with the peer window,
    and fairseq-train on the same pairs (binarized here, before any timing)."""
    first, last = args.peer_updates
    window = argparse.Namespace(**{**vars(args), "warmup": first, "updates": last - first})
    tmt = train_spec(
        "peer-tmt-float32",
        peer_config(),
        dtype="float32",
        args=window,
        sizes=sizes,
        spm=spm,
        src=src,
        tgt=tgt,
        keep=False,
    )
    cfg = from_dict(tmt["config"], source="benchmark peer")
    env = require_env(args.fairseq_env)
    print(f"benchmark: binarizing the peer's pieces for fairseq -> {args.out / 'fairseq'}", file=sys.stderr, flush=True)
    data = prepare(cfg, env=env, out=args.out / "fairseq")
    command = train_command(
        cfg, env=env, data_bin=Path(data["data_bin"]), save_dir=args.out / "runs" / "peer-fairseq", last_update=last
    )
    fairseq = {
        "kind": "fairseq",
        "name": "peer-fairseq-float32",
        "threads": args.threads,
        "command": command,
        "first": first,
        "last": last,
        "save_dir": str(args.out / "runs" / "peer-fairseq"),
        "data": data,
    }
    return [{**tmt, "peer": "tmt"}, {**fairseq, "peer": "fairseq"}]


def report(phases: list[tuple[dict, dict]], matmul: dict) -> dict:
    """The peer section of benchmark.json: both rows, the ratio, the fp32 matmul peak they are measured against."""
    (tmt_spec, tmt), (fs_spec, fs) = sorted(phases, key=lambda p: p[0]["peer"] != "tmt")
    peak = matmul["float32"]["gflops"]
    # measured on tmt's model and batches; the same model and batches up to padding on fairseq's side
    flops = tmt["flops_per_token"]
    rows = {
        "tmt": {
            k: tmt[k] for k in ("tokens_per_s", "seconds", "target_tokens", "vocab_size", "parameters", "peak_rss_mib")
        },
        "fairseq": {
            "tokens_per_s": fs["tokens_per_s"],
            "seconds": fs["seconds"],
            "target_tokens": fs["target_tokens"],
            "wall_tokens_per_s": fs["wall_tokens_per_s"],
            "vocab_size": fs["dictionary_size"],
            "version": fs["fairseq_version"],
            "peak_rss_mib": fs["fairseq_peak_rss_mib"],
            "log": fs["log"],
        },
    }
    for row in rows.values():
        row["gflops"] = flops * row["tokens_per_s"] / 1e9
        row["fraction_of_fp32_peak"] = row["gflops"] / peak
    return {
        "config": f"{PEER_CONFIG.relative_to(REPO)} --set " + " --set ".join(PEER_OVERRIDES),
        "model_config": tmt_spec["config"]["model"],
        "train_config": tmt_spec["config"]["train"],
        "updates": [fs_spec["first"], fs_spec["last"]],
        "threads": tmt_spec["threads"],
        "fairseq_command": fs_spec["command"],
        "data": fs_spec["data"],
        "flops_per_token": flops,
        "fp32_matmul_peak_gflops": peak,
        "rows": rows,
        "ratio": tmt["tokens_per_s"] / fs["tokens_per_s"],
        "loadavg_fairseq": [fs["loadavg_start"], fs["loadavg_end"]],
        "fairseq_tokens_per_s_method": "sum of wpb / sum of (wpb / wps) "
        "over the train_inner lines of the timed updates",
    }


def render(r: dict) -> str:
    """The peer table of benchmark.md (appended after the benchmark's own); "" without a peer section."""
    p = r.get("peer")
    if not p:
        return ""
    m, (first, last), rows = p["model_config"], p["updates"], p["rows"]
    head = [
        "",
        "target tokens/s",
        "ratio",
        "GFLOP/s",
        "% of fp32 matmul peak",
        "tokens/update",
        "vocabulary",
        "peak RSS MiB",
    ]
    mc = r["machine"]
    lines = [
        "",
        f"## Side by side: tmt and fairseq {rows['fairseq']['version']}, same config, same run",
        "",
        f"{r['date']}; {mc['cpu']}, {mc['logical_cpus']} logical CPUs, {p['threads']} threads; "
        f"torch {mc['torch']} ({mc['cpu_capability']}); "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end; "
        f"fp32 matmul peak {p['fp32_matmul_peak_gflops']:.1f} GFLOP/s "
        f"(n={r['matmul_peak']['n']}, the faster of the run's first and last timing). "
        f"Config: `{p['config']}` ({m['encoder_layers']}+{m['decoder_layers']} layers, d{m['d_model']}, "
        f"ff{m['d_ff']}, {m['heads']} heads, "
        f"{m['norm']}-norm, dropout {m['dropout']:g}, activation dropout {m['activation_dropout']:g}, "
        f"{p['train_config']['max_tokens']:,}-token batches, float32). "
        f"Target tokens/s over updates {first + 1}-{last}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, label in (
        ("fairseq", f"fairseq {rows['fairseq']['version']} (`fairseq-train --cpu`, wps)"),
        ("tmt", "tmt (`Trainer`)"),
    ):
        row = rows[name]
        ratio = row["tokens_per_s"] / rows["fairseq"]["tokens_per_s"]
        bold = "**" if name == "tmt" else ""
        lines.append(
            f"| {label} | {row['tokens_per_s']:,.0f} | {bold}{ratio:.2f}{bold} | "
            f"{row['gflops']:.1f} | {100 * row['fraction_of_fp32_peak']:.1f} | "
            f"{row['target_tokens'] / (last - first):,.0f} | "
            f"{row['vocab_size']:,} | {row['peak_rss_mib']:.0f} |"
        )
    wall = rows["fairseq"]["wall_tokens_per_s"]
    lines += [
        "",
        f"fairseq tokens/s: {p['fairseq_tokens_per_s_method']}"
        + (f" (line arrival times give {wall:,.0f})" if wall else "")
        + "; GFLOP/s: tmt's measured FLOPs per target token (FlopCounterMode) x each side's tokens/s. "
        f"Same {p['data']['pairs']:,} pairs on both sides, binarized from tmt's pieces.",
    ]
    return "\n".join(lines) + "\n"
