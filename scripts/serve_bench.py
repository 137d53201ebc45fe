"""`tmt serve` under concurrent single-line clients, beside the in-process Translator on the same lines.

Trains nothing. Takes a checkpoint (-c) or builds a tiny random one (--tiny DIR: a sentencepiece model
on the lines and a 1+1-layer model; enough to exercise the path, not to time a real model), then in one run:

1. the in-process ``Translator`` on every line in one ``translate_batch`` call (sentences/s), and one line
   per call (the latency of a direct single-line call);
2. ``tmt serve`` started on loopback in a subprocess with the same threads, and for each client count
   (1, 8, 32, 64) every line sent as its own request, the clients sharing the lines; sentences/s,
   p50/p95/p99 latency, and the decode calls' sizes read from /metrics; every answer is checked against
   the in-process translation of its line.

It prints a markdown table (and writes it as JSON with --json). The targets: 32 clients reach at
least 70% of the in-process batched sentences/s; one client's p50 is within 1.2x of a direct call. Time it on
a quiet machine: other work on the CPU moves every number.

    python scripts/serve_bench.py -c runs/multi30k_en_de/checkpoint_best.pt --threads 2
    python scripts/serve_bench.py --tiny /tmp/tiny --lines 40 --clients 1,8 --json bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SRC = REPO.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def build_tiny(lines: list[str], out_dir: Path) -> Path:
    """A random 1+1-layer checkpoint with a 200-piece sentencepiece model trained on ``lines``."""
    import torch

    from transformer_mt.checkpoint import pack_tokenizers, save_checkpoint
    from transformer_mt.config import load_config, to_dict
    from transformer_mt.model import Transformer
    from transformer_mt.text import Tokenizer, train_sentencepiece

    out_dir.mkdir(parents=True, exist_ok=True)
    text = out_dir / "spm_input.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = Tokenizer(train_sentencepiece([text], out_dir / "spm", vocab_size=200))
    cfg = load_config(
        None,
        ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.heads=2", "model.d_ff=64"]
        + ["model.max_positions=128", "data.max_len=120", "decode.beam=2"],
    )
    torch.manual_seed(0)
    model = Transformer(cfg.model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    path = out_dir / "tiny.pt"
    save_checkpoint(
        {"model": model.state_dict(), "config": to_dict(cfg), "tokenizers": pack_tokenizers(tok.proto)}, path
    )
    return path


def in_process(ckpt: Path, lines: list[str], *, threads: int, beam: int | None) -> tuple[list[str], list[dict]]:
    """The Translator's translations and its two rows: all lines in one call, and one line per call."""
    from transformer_mt.decoding import Translator

    tr = Translator.from_checkpoint(ckpt, device="cpu", threads=threads)
    beam_, lenpen = tr.decode_defaults(beam, None)
    tr.translate_batch(lines[:4], beam=beam_, lenpen=lenpen)  # warm-up
    tic = time.perf_counter()
    result = tr.translate_batch(lines, beam=beam_, lenpen=lenpen)
    batched_s = time.perf_counter() - tic
    latencies = []
    for line in lines:
        tic = time.perf_counter()
        tr.translate_batch([line], beam=beam_, lenpen=lenpen)
        latencies.append(time.perf_counter() - tic)
    rows = [
        {
            "mode": "in-process, all lines in one call",
            "clients": 0,
            "sentences_per_s": len(lines) / batched_s,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
        },
        _latency(
            {"mode": "in-process, one line per call", "clients": 1, "sentences_per_s": len(lines) / sum(latencies)},
            latencies,
        ),
    ]
    return [nb[0][1] for nb in result.hypotheses], rows


def _latency(row: dict, seconds: list[float]) -> dict:
    return {**row, **{f"p{q}_ms": 1000 * percentile(seconds, q) for q in (50, 95, 99)}}


def start_server(ckpt: Path, *, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "transformer_mt.cli",
        "serve",
        "-c",
        f"bench={ckpt}",
        "--port",
        str(port),
        "--threads",
        str(threads),
    ]
    proc = subprocess.Popen([*cmd, "--log-level", "warning", "--timeout", "0", "--max-queue", "4096", *extra], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # up to 2 minutes for the model to load
        if proc.poll() is not None:
            raise SystemExit(f"serve_bench: the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("serve_bench: the server did not become ready in 2 minutes")


def batch_sums(url: str) -> dict[str, float]:
    """The decode calls' histogram sums and counts from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"tmt_batch_lines_sum", "tmt_batch_lines_count", "tmt_batch_requests_sum"}
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)
    return {s.name: s.value for f in families for s in f.samples if s.name in wanted}


async def clients(
    url: str, lines: list[str], n: int, *, beam: int | None
) -> tuple[list[float], list[str | None], float]:
    """``n`` clients sending the lines one per request, each taking the next unsent line;
    latencies, answers, wall time."""
    answers: list[str | None] = [None] * len(lines)
    latencies: list[float] = []
    queue = iter(range(len(lines)))
    body = {} if beam is None else {"beam": beam}
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)
    ) as client:

        async def one() -> None:
            for i in queue:
                tic = time.perf_counter()
                r = await client.post("/translate", json={"text": lines[i], **body})
                latencies.append(time.perf_counter() - tic)
                answers[i] = r.json()["translations"][0] if r.status_code == 200 else None

        tic = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return latencies, answers, time.perf_counter() - tic


def served(url: str, lines: list[str], counts: list[int], expected: list[str], *, beam: int | None) -> list[dict]:
    asyncio.run(clients(url, lines[: min(len(lines), 16)], 4, beam=beam))  # warm-up
    rows = []
    for n in counts:
        before = batch_sums(url)
        latencies, answers, wall = asyncio.run(clients(url, lines, n, beam=beam))
        after = batch_sums(url)
        calls = after["tmt_batch_lines_count"] - before["tmt_batch_lines_count"]
        row = {"mode": "tmt serve, single-line requests", "clients": n, "sentences_per_s": len(lines) / wall}
        row = _latency(row, latencies)
        row["batch_lines_mean"] = (after["tmt_batch_lines_sum"] - before["tmt_batch_lines_sum"]) / max(calls, 1)
        row["batch_requests_mean"] = (after["tmt_batch_requests_sum"] - before["tmt_batch_requests_sum"]) / max(
            calls, 1
        )
        row["mismatches"] = sum(a != e for a, e in zip(answers, expected))
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    base = rows[0]["sentences_per_s"]
    direct = rows[1]["p50_ms"]
    out = [
        "| mode | clients | sentences/s | % of in-process batched | p50 ms | p95 ms | p99 ms | p50 / direct call "
        "| lines per call | requests per call | wrong answers |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def fmt(value, spec: str) -> str:
        return "" if value is None else format(value, spec)

    for r in rows:
        cells = [
            r["mode"],
            str(r["clients"] or "-"),
            fmt(r["sentences_per_s"], ".1f"),
            fmt(100 * r["sentences_per_s"] / base, ".0f"),
        ]
        cells += [fmt(r.get(f"p{q}_ms"), ".1f") for q in (50, 95, 99)]
        cells += [fmt(r["p50_ms"] / direct if r.get("p50_ms") is not None else None, ".2f")]
        cells += [
            fmt(r.get("batch_lines_mean"), ".1f"),
            fmt(r.get("batch_requests_mean"), ".1f"),
            fmt(r.get("mismatches"), "d"),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-c", "--checkpoint", type=Path, help="the checkpoint to serve")
    source.add_argument("--tiny", type=Path, metavar="DIR", help="build a tiny random checkpoint in DIR and use it")
    p.add_argument("--src", type=Path, default=DEFAULT_SRC, help="source lines (default: Multi30k test_2016_flickr.en)")
    p.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    p.add_argument("--clients", default="1,8,32,64", help="comma-separated client counts")
    p.add_argument("--beam", type=int, default=None, help="beam for both sides (default: the checkpoint's)")
    p.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("TMT_BENCH_THREADS", "0")),
        help="torch threads for both sides (0: torch's default)",
    )
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    p.add_argument("serve_args", nargs="*", help="after --: more `tmt serve` options, e.g. -- --batch-wait-ms 10")
    args = p.parse_args(argv)
    every = args.src.read_text(encoding="utf-8").splitlines()
    lines = every[: args.lines] if args.lines else every
    ckpt = args.checkpoint or build_tiny(every, args.tiny)  # the tokenizer learns from the whole file
    expected, rows = in_process(ckpt, lines, threads=args.threads, beam=args.beam)
    proc, url = start_server(ckpt, threads=args.threads, extra=args.serve_args)
    try:
        rows += served(url, lines, [int(n) for n in args.clients.split(",")], expected, beam=args.beam)
    finally:
        proc.terminate()
        proc.wait(60)
    print(markdown(rows))
    if args.json:
        args.json.write_text(
            json.dumps({"checkpoint": ckpt.name, "lines": len(lines), "threads": args.threads, "rows": rows}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
