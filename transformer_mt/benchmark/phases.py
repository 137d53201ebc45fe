"""The benchmark's own phases, each run in a fresh process from its spec (a JSON-able dict) by
:mod:`transformer_mt.benchmark.runner`: the matmul peak, training, translation and the host-sync counts."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import shutil
import statistics
import time
from collections.abc import Callable
from typing import cast

import torch

from transformer_mt.benchmark.flops import train_step_flops
from transformer_mt.benchmark.settings import DTYPES
from transformer_mt.config import from_dict
from transformer_mt.data import source_tensor
from transformer_mt.decoding import Translator, beam_search, greedy_search, positions_needed
from transformer_mt.model import count_parameters
from transformer_mt.runtime import DTYPES as TORCH_DTYPES
from transformer_mt.runtime import SyncCounter, forward_flops, per_call, pick_device
from transformer_mt.text import PAD_ID
from transformer_mt.training import Trainer, UpdateStats, set_up, target_tokens, update_schedule


def phase_matmul(spec: dict) -> dict:
    """An n x n matmul per dtype: after 3 warm-up runs, the best of ``reps`` timed runs (GFLOP/s = 2 n^3 / s)."""
    n, reps = spec["n"], spec["reps"]
    device = pick_device(spec.get("device", "cpu"))  # on CUDA float32 matmuls use TF32 (runtime.use_cuda)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = {"n": n, "reps": reps}
    for name in DTYPES:
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=TORCH_DTYPES[name]) for _ in range(2))
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
        out[name] = {
            "gflops": 2 * n**3 / min(times) / 1e9,
            "gflops_median": 2 * n**3 / statistics.median(times) / 1e9,
            "seconds_best": min(times),
        }
    return out


# ---------------------------------------------------------------- train
@dataclasses.dataclass
class _Timing:
    """What Trainer's on_update hook records: the window's two marks and each timed update's tokens and seconds."""

    warmup: int
    updates: int
    cuda: bool
    marks: dict = dataclasses.field(default_factory=dict)
    tokens: list = dataclasses.field(default_factory=list)
    step_seconds: list = dataclasses.field(default_factory=list)

    # the hook reads the loss: every update ends synchronised
    def on_update(self, update: int, stats: UpdateStats) -> None:
        if update > self.warmup:
            self.tokens.append(stats.tokens)
            self.step_seconds.append(stats.seconds)
        if update in (self.warmup, self.warmup + self.updates):  # the window: end of update `warmup` to end of the last
            self.marks[update] = time.perf_counter()
            if self.cuda and update == self.warmup:
                torch.cuda.reset_peak_memory_stats()


def phase_train(spec: dict) -> dict:
    """``tmt train``'s own loop for warmup + updates updates, the last ``updates`` timed; FLOPs counted on the
    batches it trained on (measured on the first ``flop_batches``, analytic on all)."""
    cfg = from_dict(spec["config"], source=f"benchmark {spec['name']}")
    if spec.get("plain_ops"):  # the baseline of the CPU speed-ups: the reference backend (torch's own dropout,
        cfg.train.ops = "reference"  # F.linear, SDPA, the unfused logits-then-loss path with the (N, V) logits)
    warmup, updates = spec["warmup"], spec["updates"]
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)  # ours (<out>/runs/NAME); Trainer refuses an old run
    timing = _Timing(warmup, updates, cuda=cfg.train.device.startswith("cuda"))
    trainer = Trainer(set_up(cfg, resume=False), on_update=timing.on_update)
    if spec.get("compile"):  # the training step (model and fused loss) compiled; shapes vary from batch to batch
        # compiling a Module gives an OptimizedModule, a Module too (torch.compile's annotation says Callable)
        trainer.parts.train_model = cast(torch.nn.Module, torch.compile(trainer.parts.train_model, dynamic=True))
    result = trainer.run()
    gpu_peak_mib = torch.cuda.max_memory_allocated() / 2**20 if timing.cuda else None
    if len(timing.marks) < 2:
        raise RuntimeError(
            f"training stopped at update {result.progress.update} ({result.stop_reason}) "
            f"before update {warmup + updates}"
        )
    seconds = timing.marks[warmup + updates] - timing.marks[warmup]
    # the timed updates' batches, as Trainer.run took them
    timed = itertools.islice(update_schedule(trainer.train_data, cfg.train), warmup, warmup + updates)
    batches = [trainer.train_data.get_batch(idx) for u in timed for idx in u.batches]
    if sum(b.ntokens for b in batches) != sum(timing.tokens):
        raise RuntimeError("the batches replayed for FLOP counting differ from those Trainer.run trained on")
    out = {
        "parameters": count_parameters(trainer.model),
        "vocab_size": trainer.model.output_size,  # K kept pieces with model.restrict_output
        "max_tokens": cfg.train.max_tokens,
        "update_freq": cfg.train.update_freq,
        "warmup_updates": warmup,
        "timed_updates": updates,
        "seconds": seconds,
        "update_fn_seconds": sum(timing.step_seconds),
        **_batch_counts(batches, seconds=seconds, updates=updates),
        **_flops_per_token(trainer, cfg, batches, flop_batches=spec["flop_batches"]),
        "device": cfg.train.device,
        "compiled": bool(spec.get("compile")),
        **compile_counts(),
    }
    if timing.cuda:
        out.update(gpu_peak_memory_mib=gpu_peak_mib, gpu=torch.cuda.get_device_name())
    if not spec["keep_checkpoint"]:
        shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    return out


def _batch_counts(batches: list, *, seconds: float, updates: int) -> dict:
    """Tokens, sentences, lengths, padding and rates of the timed batches (target tokens: non-pad pieces + EOS)."""
    ntok, nsent = sum(b.ntokens for b in batches), sum(b.nsentences for b in batches)
    src_tokens = sum(int((b.src != PAD_ID).sum()) for b in batches)
    return {
        "target_tokens": ntok,
        "source_tokens": src_tokens,
        "sentences": nsent,
        "avg_src_len": src_tokens / nsent,
        "avg_tgt_len": ntok / nsent,
        "target_padding_fraction": 1 - ntok / sum(b.tgt_out.numel() for b in batches),
        "tokens_per_s": ntok / seconds,
        "updates_per_s": updates / seconds,
    }


def _flops_per_token(trainer: Trainer, cfg, batches: list, *, flop_batches: int) -> dict:
    """FLOPs per target token of the timed batches: the analytic count (3 x forward) of every one of them, times the
    ratio of the measured count (FlopCounterMode) to the analytic one on ``flop_batches`` batches spread over the
    window. A few batches stand for the window's shapes only through that ratio: their own FLOPs per token move with
    their lengths and padding (three batches in a row read 8% above the window's mean). With no batch to measure
    (CUDA), the analytic count."""
    vocab = trainer.model.output_size
    step = max(1, len(batches) // flop_batches) if flop_batches else 0
    sample = batches[::step][:flop_batches] if step else []

    def analytic(b) -> int:
        return 3 * forward_flops(
            cfg.model, vocab=vocab, batch=b.nsentences, src_len=b.src.size(1), tgt_len=b.tgt_in.size(1)
        )

    total = sum(analytic(b) for b in batches)
    measured = sum(
        train_step_flops(trainer.model, b, dtype=cfg.train.dtype, epsilon=cfg.train.label_smoothing) for b in sample
    )
    ratio = measured / sum(analytic(b) for b in sample) if sample else 1.0
    ntok = sum(b.ntokens for b in batches)
    return {
        "flops_per_token": total * ratio / ntok,
        "flops_per_token_analytic": total / ntok,
        "flops_measured_over_analytic": ratio,
        "flops_per_token_sample": measured / sum(b.ntokens for b in sample) if sample else None,
        "flop_sample_batches": len(sample),
    }


# ---------------------------------------------------------------- syncs
def phase_syncs(spec: dict) -> dict:
    """Host syncs per training update and per search step (the budget: one each, whatever the batch and beam)."""
    cfg = from_dict(spec["config"], source=f"benchmark {spec['name']}")
    shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    trainer = Trainer(set_up(cfg, resume=False))
    try:
        updates = _update_syncs(trainer, cfg)
        search = _search_syncs(trainer, cfg, spec["input"])
    finally:
        trainer.close()
        shutil.rmtree(cfg.train.out_dir, ignore_errors=True)
    return {
        "device": str(trainer.device),
        "train_updates": updates,
        "per_update_max": max(u["syncs"] for u in updates),
        "search": search,
    }


def _update_syncs(trainer: Trainer, cfg) -> list[dict]:
    """Syncs of each of the first 3 updates, run on ``trainer`` directly (its loop not started)."""
    updates = []
    for u in itertools.islice(update_schedule(trainer.train_data, cfg.train), 3):
        batches = [trainer.train_data.get_batch(idx) for idx in u.batches]  # collated on the host, outside the count
        with SyncCounter() as syncs:
            trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
        updates.append(
            {
                "micro_batches": len(batches),
                "syncs": syncs.total,
                "kinds": dict(syncs.counts),
                "collectives": dict(syncs.collectives),
            }
        )
    return updates


def _search_syncs(trainer: Trainer, cfg, input_path: str) -> list[dict]:
    """Syncs per search step of the (untrained) model, greedy and beam 5, at batches of 8 and 32 test sentences."""
    model, d = trainer.model.eval(), cfg.decode
    with open(input_path, encoding="utf-8") as handle:
        ids = trainer.parts.state.tokenizers[0].encode([line.rstrip("\n") for line in itertools.islice(handle, 32)])
    model.reserve_positions(positions_needed(max(map(len, ids)) + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b))
    search = []
    for batch in (8, 32):
        src = source_tensor([seq[: cfg.model.max_positions - 1] for seq in ids[:batch]]).to(trainer.device)
        for name, beam in (("greedy", 1), ("beam5", 5)):
            run: Callable[[], object]
            if beam == 1:
                run = functools.partial(greedy_search, model, src, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
            else:
                run = functools.partial(
                    beam_search, model, src, beam=beam, lenpen=d.lenpen, max_len_a=d.max_len_a, max_len_b=d.max_len_b
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
    return search


# ---------------------------------------------------------------- translate
def compile_counts() -> dict:
    """Dynamo's unique graphs and graph breaks in this process (0 and 0 when nothing was compiled)."""
    from torch._dynamo.utils import counters

    return {
        "compiled_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def read_input(spec: dict) -> list[str]:
    """The phase's test lines: the first ``sentences`` of ``input`` (0: all)."""
    with open(spec["input"], encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, spec["sentences"] or None)]


def phase_translate(spec: dict) -> dict:
    """The Translator on the test lines at the checkpoint's batch_tokens and lenpen, after an untimed warm-up."""
    translator = Translator.from_checkpoint(
        spec["checkpoint"],
        device=spec.get("device", "cpu"),
        dtype=spec.get("dtype", "float32"),
        threads=spec["threads"],
        ops=spec.get("ops", "auto"),
        graphs={"eager": False, "graphed": True}.get(spec.get("mode", ""), None),
    )
    lines = read_input(spec)
    d, beam = translator.cfg.decode, spec["beam"]
    translator.translate_batch(lines[:8], beam=beam, lenpen=d.lenpen)  # warm-up: allocator, kernel selection
    tic = time.perf_counter()
    stats = translator.translate_batch(lines, beam=beam, lenpen=d.lenpen).stats  # this call's counts only
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
        **({} if translator.graphs is None else {"graphs": dataclasses.asdict(translator.graphs.stats)}),
    }
