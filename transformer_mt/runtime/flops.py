"""What a model costs: analytic matmul FLOPs for training and decoding, and the machine's matmul peak.

FLOPs count matrix multiplications only (a multiply-add is 2 FLOPs), the convention of the paper's
Table 2 "training cost" column and of ``scripts/benchmark.py``. Per batch of B sentences with padded
source length S and target length T (Ns = B S, Nt = B T; d = d_model, f = d_ff, h heads of query size
dk and value size dv, V the target vocabulary: the K kept pieces with model.restrict_output, which is
``Transformer.output_size``), one teacher-forced forward pass costs:

    encoder layer  2 Ns d h (2dk + dv) + 2 Ns h dv d      Q, K, V and output projections
                   + 2 B h S S (dk + dv)                  scores and weighted sum
                   + 4 Ns d f                             feed-forward
    decoder layer  the same with Nt and T x T (the causal mask saves nothing in SDPA), plus
                   cross-attention: 2 Nt d h dk + 2 Ns d h (dk + dv) + 2 Nt h dv d + 2 B h T S (dk + dv)
    output layer   2 Nt d V

Training costs 3 x forward (the backward pass is 2 x forward). Embedding look-ups, LayerNorm, softmax
and the loss are not matmuls and are left out (so are ScaleNorm and FixNorm's
normalisations, model.norm scale). Decoding with the KV cache runs the encoder and the
cross K/V projections once per sentence, then per step and hypothesis one query position through every
decoder layer, attending over the prefix so far.

MFU (model FLOPs utilisation) = achieved training FLOP/s / the machine's peak. The peak is the best of
a few timed n x n matmuls of the training dtype, measured once per (device, dtype, threads) and cached
in ``$TMT_CACHE_DIR/peak.json`` (default ``~/.cache/tmt/peak.json``), or given as ``peak_tflops``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from transformer_mt.config import ModelConfig

# matmul side for the peak: large enough to reach the BLAS steady state, small enough to time in ~1 s.
PEAK_N = {"cpu": 1024, "cuda": 8192, "mps": 4096}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dims(m: ModelConfig) -> tuple[int, int, int, int, int]:
    d, h = m.d_model, m.heads
    return d, h, m.d_ff, m.head_dim or d // h, m.value_dim or d // h


def forward_flops(m: ModelConfig, *, vocab: int, batch: int, src_len: int, tgt_len: int) -> int:
    """Matmul FLOPs of one teacher-forced forward pass over a padded (batch, src_len) x (batch, tgt_len)
    batch: the formula of the module docstring."""
    d, h, f, dk, dv = _dims(m)
    ns, nt = batch * src_len, batch * tgt_len
    qkv_out = lambda n: 2 * n * d * h * (2 * dk + dv) + 2 * n * h * dv * d  # noqa: E731
    attend = lambda tq, tk: 2 * batch * h * tq * tk * (dk + dv)  # noqa: E731
    cross = 2 * nt * d * h * dk + 2 * ns * d * h * (dk + dv) + 2 * nt * h * dv * d + attend(tgt_len, src_len)
    encoder = m.encoder_layers * (qkv_out(ns) + attend(src_len, src_len) + 4 * ns * d * f)
    decoder = m.decoder_layers * (qkv_out(nt) + attend(tgt_len, tgt_len) + cross + 4 * nt * d * f)
    return encoder + decoder + 2 * nt * d * vocab


def train_flops(m: ModelConfig, *, vocab: int, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward + backward of one padded batch: 3 x :func:`forward_flops`."""
    return 3 * forward_flops(m, vocab=vocab, batch=batch, src_len=src_len, tgt_len=tgt_len)


def decode_flops(m: ModelConfig, *, vocab: int, src_len: int, tgt_len: int, beam: int = 1) -> int:
    """Matmul FLOPs of decoding one sentence of ``src_len`` tokens into ``tgt_len`` steps (EOS included)
    with the KV cache, ``beam`` hypotheses per step (all kept to the end: an upper bound for beam search)."""
    d, h, f, dk, dv = _dims(m)
    s = src_len
    encoder = m.encoder_layers * (
        2 * s * d * h * (2 * dk + dv) + 2 * s * h * dv * d + 2 * h * s * s * (dk + dv) + 4 * s * d * f
    )
    cross_kv = m.decoder_layers * 2 * s * d * h * (dk + dv)  # once per sentence (DecoderCache)
    steps = 0
    for t in range(tgt_len):  # one query position that sees t + 1 cached positions (itself included)
        self_attn = 2 * d * h * (2 * dk + dv) + 2 * h * dv * d + 2 * h * (t + 1) * (dk + dv)
        cross = 2 * d * h * dk + 2 * h * dv * d + 2 * h * s * (dk + dv)
        steps += m.decoder_layers * (self_attn + cross + 4 * d * f) + 2 * d * vocab
    return encoder + cross_kv + beam * steps


def per_target_token(m: ModelConfig, *, vocab: int, src_len: int, tgt_len: int, beam: int = 1) -> dict[str, float]:
    """FLOPs per target token of one unpadded sentence pair: {"train": 3 x forward / T, "decode": decode / T}."""
    return {
        "train": train_flops(m, vocab=vocab, batch=1, src_len=src_len, tgt_len=tgt_len) / tgt_len,
        "decode": decode_flops(m, vocab=vocab, src_len=src_len, tgt_len=tgt_len, beam=beam) / tgt_len,
    }


# ---------------------------------------------------------------- the machine's peak
def device_name(device: torch.device) -> str:
    """A stable name for the peak cache: the GPU's name, or the CPU model from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"mps {platform.machine()}"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure_peak(
    dtype: str = "float32", *, device: torch.device | str = "cpu", n: int | None = None, reps: int = 5
) -> float:
    """FLOP/s of the best of ``reps`` timed n x n matmuls (after 3 untimed ones): 2 n^3 / seconds."""
    device = torch.device(device)
    n = n or PEAK_N.get(device.type, 1024)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=_DTYPES[dtype]) for _ in range(2))
    c = torch.empty_like(a)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for _ in range(3):  # thread pool start-up, BLAS kernel selection, GPU clocks
        torch.mm(a, b, out=c)
    sync(device)
    best = float("inf")
    for _ in range(reps):
        tic = time.perf_counter()
        torch.mm(a, b, out=c)
        sync(device)
        best = min(best, time.perf_counter() - tic)
    return 2 * n**3 / best


def cache_path() -> Path:
    root = os.environ.get("TMT_CACHE_DIR") or Path.home() / ".cache" / "tmt"
    return Path(root) / "peak.json"


def peak_key(dtype: str, device: torch.device) -> str:
    threads = f"|{torch.get_num_threads()} threads" if device.type == "cpu" else ""
    return f"{device_name(device)}|{dtype}{threads}"


def cached_peak(dtype: str = "float32", *, device: torch.device | str = "cpu") -> float:
    """The matmul peak (FLOP/s) of this device, dtype and thread count: read from the cache, or measured
    once and written there (atomically; an unwritable cache only costs a re-measurement next time)."""
    device = torch.device(device)
    path, key = cache_path(), peak_key(dtype, device)
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        table = {}
    entry = table.get(key) if isinstance(table, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("flops_per_s"), (int, float)) and entry["flops_per_s"] > 0:
        return float(entry["flops_per_s"])
    peak = measure_peak(dtype, device=device)
    table = table if isinstance(table, dict) else {}
    table[key] = {"flops_per_s": peak, "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
    return peak


# ---------------------------------------------------------------- the training cost report
def batches_train_flops(m: ModelConfig, batches, *, vocab: int) -> int:
    """:func:`train_flops` summed over padded :class:`~transformer_mt.data.corpus.Batch` es (src (B, S), tgt_in (B, T)),
    as the benchmark counts them: padding included, the output layer over every target position."""
    return sum(
        train_flops(m, vocab=vocab, batch=b.src.size(0), src_len=b.src.size(1), tgt_len=b.tgt_in.size(1))
        for b in batches
    )


def cost_summary(
    *,
    tokens: int,
    train_flops: float,
    update_seconds: float,
    wall_seconds: float,
    peak_flops_per_s: float,
    peak_source: str,
    world_size: int = 1,
) -> dict[str, float | int | str]:
    """The training cost fields of the "summary" record (plain types, for metrics.jsonl), beside its
    ``target_tokens`` and ``wall``: FLOPs, achieved FLOP/s and MFU.

    ``tokens`` and ``train_flops`` are the whole run's (all ranks); ``update_seconds`` the time inside
    updates (forward, backward, optimizer: validation and checkpoints excluded), ``wall_seconds`` all of
    it. ``mfu`` = FLOPs / update_seconds / (peak x world_size); ``mfu_wall`` the same over the wall time."""
    peak = peak_flops_per_s * world_size
    busy = update_seconds if update_seconds > 0 else wall_seconds
    achieved = train_flops / max(busy, 1e-9)
    return {
        "train_flops": float(train_flops),
        "flops_per_token": train_flops / max(tokens, 1),
        "update_seconds": round(busy, 2),
        "achieved_tflops": achieved / 1e12,
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "mfu": achieved / peak if peak > 0 else 0.0,
        "mfu_wall": train_flops / max(wall_seconds, 1e-9) / peak if peak > 0 else 0.0,
    }


def peak_for(dtype: str, *, device: torch.device | str, peak_tflops: float = 0.0) -> tuple[float, str]:
    """(peak FLOP/s, where it came from): the configured ``peak_tflops`` if > 0, else :func:`cached_peak`."""
    if peak_tflops > 0:
        return peak_tflops * 1e12, "config"
    return cached_peak(dtype, device=device), f"measured ({cache_path()})"


def format_cost(s: dict, *, tokens: int, wall_seconds: float) -> str:
    """One log line for the end of training from :func:`cost_summary`'s fields."""
    return (
        f"training cost: {tokens:,} target tokens, {s['train_flops']:.3g} FLOPs "
        f"({s['flops_per_token']:.3g} per token), {wall_seconds:.0f} s wall ({s['update_seconds']:.0f} s in updates), "
        f"{s['achieved_tflops'] * 1e3:.1f} GFLOP/s = MFU {100 * s['mfu']:.1f}% "
        f"of a {s['peak_tflops'] * 1e3:.1f} GFLOP/s peak [{s['peak_source']}]"
    )
