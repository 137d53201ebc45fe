"""One update: its batches, the gradient accumulation and the optimizer step, and what the loop counts on the host.

One update = `update_freq` token-budget batches whose gradients are summed, normalised by the update's
target-token count, clipped, and applied by Adam under the schedule (`run_update`).

Host syncs (each stalls a GPU; tests count them): one per update, the gradient norm, which the NaN guard needs
on the host to decide whether Adam steps and the schedule advances (it does not on an overflow or NaN).
Labels are selected by index (`Batch.labels`), and "loss" / "nll" stay on the device as float64 sums,
summed across ranks by one all-reduce that does not block the host under NCCL.

Data parallel (torchrun, WORLD_SIZE > 1):
- Batches. Every rank computes the same epoch batch list (a function of seed and epoch); an update consumes
  the next world_size x update_freq batches of it, rank r taking those at positions r, r + world_size, ...
  (`update_schedule` and `UpdateBatches.share`). So an update sees exactly the batches of one process with
  update_freq x world_size, and `Progress.batch_in_epoch` counts these global batches: a checkpoint saved
  under one world size resumes under any other.
- Epoch remainder. When the last window of an epoch holds fewer batches than ranks, a rank left without one
  runs the window's first batch with weight 0, so that it takes part in the gradient all-reduce; no batch is
  dropped or repeated.
- Loss. The update's target tokens are summed over ranks (`target_tokens` counts them on the host) and each
  rank's loss is divided by that sum, times world_size because DDP averages gradients: the gradient is that
  of one process on the whole global batch. Only the last micro-batch of an update all-reduces.

Packed batches (`train.packed`; `auto`: with the cuda backend on a CUDA device): each collated batch is packed on the
host (`data.pack`), its sentences end to end, and the model computes nothing on padding (`Transformer.encode_packed`).
The labels, their order and the normaliser are the padded batch's, so the loss and gradients are the same up to float
rounding; the dropout masks are drawn over the other layout, so with dropout the numbers differ (not their law).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

import torch
from torch.nn.parallel import DistributedDataParallel

from transformer_mt import runtime
from transformer_mt.config import ModelConfig, TrainConfig
from transformer_mt.data import Batch, MixedCorpus, ParallelData, SampledSegmentation, pack
from transformer_mt.model import Packing, Segments
from transformer_mt.runtime import flops
from transformer_mt.training.state import Progress, TrainState

# a training corpus: the encoded pairs, their re-segmentation every epoch, or several corpora mixed by weight
Corpus = ParallelData | SampledSegmentation | MixedCorpus


@dataclass(frozen=True)
class UpdateStats:
    """What one update reports (`run_update`): the log's window sums it (runlog.Window), the NaN guard counts its
    norm (stopping.Divergence), the progress adds its tokens and seconds, and an `on_update` hook receives it.

    `loss` and `nll` are sums over the update's target tokens and all ranks: device scalars, which the log reads on
    the host once per window, or floats when the update was asked for them on the host (`host_stats`)."""

    loss: torch.Tensor | float  # label-smoothed cross-entropy (the optimised objective), summed
    nll: torch.Tensor | float  # cross-entropy without smoothing, summed
    tokens: int  # target tokens of the whole update (pieces + EOS, all ranks)
    lr: float  # the learning rate the update ran with
    gnorm: float  # the gradient norm before clipping; not finite: the update was skipped (the NaN guard)
    seconds: float  # host seconds inside the update


@dataclass(frozen=True)
class UpdateBatches:
    """The global batches of one update: consecutive batches of its epoch's list."""

    epoch: int
    start: int  # position of its first batch in the epoch's batch list
    batches: list  # index arrays (ParallelData.get_batch), at most world_size x update_freq of them
    last: bool  # it ends the epoch

    def share(self, rank: int, world_size: int) -> list:
        """Rank r's batches: positions r, r + world_size, ...; empty for a rank left without one at an epoch's end."""
        return self.batches[rank::world_size]

    def rank_batches(
        self, data: Corpus, rank: int, world_size: int, *, pad_to_multiple: int = 0
    ) -> tuple[list[Batch], Batch | None]:
        """Rank r's Batches of this update (its share), and with none the filler it runs with weight 0: the update's
        first batch. `pad_to_multiple`: their lengths padded up to a multiple of it (train.pad_to_multiple)."""
        mine = self.share(rank, world_size)
        pad = pad_to_multiple
        filler = None if mine else data.get_batch(self.batches[0], pad_to_multiple=pad)
        return [data.get_batch(idx, pad_to_multiple=pad) for idx in mine], filler


def update_schedule(
    data: Corpus, t: TrainConfig, *, world_size: int = 1, epoch: int = 1, start: int = 0
) -> Iterator[UpdateBatches]:
    """Every update's batches in training order, from batch `start` of `epoch` on, until t.max_epochs
    (0: for ever). The same on every rank, and for one process with update_freq x world_size."""
    per_update = world_size * t.update_freq
    while not t.max_epochs or epoch <= t.max_epochs:
        batches = data.batches(epoch, max_tokens=t.max_tokens, seed=t.seed)
        for i in range(start, len(batches), per_update):
            yield UpdateBatches(epoch, i, batches[i : i + per_update], last=i + per_update >= len(batches))
        epoch, start = epoch + 1, 0


def target_tokens(data: Corpus, batches: list) -> int:
    """Target tokens (pieces + EOS) of the pairs in `batches` (index arrays), from the lengths on the host:
    every rank knows the whole update's count without an all-reduce (it equals the sum of `Batch.ntokens`)."""
    return sum(int(data.tgt_lengths[idx].sum()) + len(idx) for idx in batches)


def update_flops(data: Corpus, batches: list, m: ModelConfig, *, vocab: int) -> int:
    """Training FLOPs of the whole update (all ranks), counted as the benchmark counts them (padded batches,
    flops.train_flops), from the lengths on the host: padded source = longest + EOS, target = longest + BOS."""
    return sum(
        flops.train_flops(
            m,
            vocab=vocab,
            batch=len(idx),
            src_len=int(data.src_lengths[idx].max()) + 1,
            tgt_len=int(data.tgt_lengths[idx].max()) + 1,
        )
        for idx in batches
    )


def sampling_line(data: SampledSegmentation, epoch: int) -> str:
    """The log line of an epoch's sampled segmentation (data.subword_alpha): its time and how many pieces it makes."""
    st = data.last_stats
    return (
        f"epoch {epoch}: sampled segmentation in {st['seconds']:.1f} s, pieces x{st['src_piece_ratio']:.3f} (source) "
        f"x{st['tgt_piece_ratio']:.3f} (target) of the best segmentation"
    )


def run_cost(p: Progress, t: TrainConfig, *, device: torch.device, world_size: int) -> dict:
    """The training cost fields of the "summary" record (flops.cost_summary) for the run so far."""
    peak, source = flops.peak_for(t.dtype, device=device, peak_tflops=t.peak_tflops)
    return flops.cost_summary(
        tokens=p.tokens,
        train_flops=p.flops,
        update_seconds=p.update_seconds,
        wall_seconds=p.elapsed,
        peak_flops_per_s=peak,
        peak_source=source,
        world_size=world_size,
    )


def packs_batches(setting: str, *, ops: str, device: torch.device) -> bool:
    """`train.packed` resolved: `on`, `off`, or `auto`: packed with the cuda backend on a CUDA device (the backend
    with a kernel that skips padding; elsewhere the packed attention is computed padded, so packing gains nothing)."""
    if setting == "auto":
        return ops == "cuda" and device.type == "cuda"
    return setting == "on"


def loss_inputs(batch: Batch, device: torch.device, *, packed_pad: int | None) -> tuple[tuple, dict]:
    """The loss module's arguments for `batch`, moved to `device` (from pinned memory on CUDA: no wait): the padded
    batch, or with `packed_pad` (the model's pad id) the batch packed (`data.pack`) and its `Packing`."""
    if packed_pad is None:
        b = batch.to(device, non_blocking=True)
        return (b.src, b.tgt_in, b.tgt_out, b.labels), {"src_padded": b.src_padded}
    p = pack(batch, pad=packed_pad).to(device, non_blocking=True)
    packing = Packing(
        Segments(p.src_cu_seqlens, p.src_max_len, p.src_positions),
        Segments(p.tgt_cu_seqlens, p.tgt_max_len, p.tgt_positions),
    )
    return (p.src, p.tgt_in, p.tgt_out), {"packing": packing}


def run_update(
    state: TrainState,
    module: torch.nn.Module,
    batches: list[Batch],
    *,
    filler: Batch | None,
    ntokens: int | None,
    dist: runtime.DistInfo,
    device: torch.device,
    host_stats: bool,
    log: Callable[[str], None],
) -> UpdateStats:
    """One optimizer update of `state` over this rank's `batches`, run through `module` (the loss module, DDP-wrapped
    in a data-parallel run). `filler`: what a rank without a batch runs, with weight 0; `ntokens`: the whole
    update's target tokens (`target_tokens`), None: summed across ranks here; `host_stats`: the loss and nll as
    floats (for an `on_update` hook)."""
    module.train()
    t, world = state.train_cfg, dist.world_size
    if ntokens is None:
        ntokens = int(runtime.all_reduce_sum([sum(b.ntokens for b in batches)], device)[0])
    if not batches and filler is None:
        raise ValueError("an update needs this rank's batches, or a filler batch to run with weight 0")
    work = [(b, 1.0) for b in batches] if batches else [(cast(Batch, filler), 0.0)]
    sums = torch.zeros(2, dtype=runtime.accumulator_dtype(device), device=device)  # loss, nll of this rank
    packed_pad = state.model.specials.pad if packs_batches(t.packed, ops=state.model.ops.name, device=device) else None
    tic = time.perf_counter()
    for i, (batch, weight) in enumerate(work):
        args, kwargs = loss_inputs(batch, device, packed_pad=packed_pad)
        # DDP all-reduces gradients in the backward of the update's last micro-batch only
        sync = i == len(work) - 1 or not dist.enabled
        with contextlib.nullcontext() if sync else cast(DistributedDataParallel, module).no_sync():
            with runtime.autocast(device, t.dtype):  # projection and loss fused, only at label positions
                loss, nll, _ = module(*args, **kwargs)
            # per-token mean over the whole update; x world: DDP averages the ranks' gradients
            scaled = loss / ntokens * (weight * world)
            (state.scaler.scale(scaled) if state.scaler is not None else scaled).backward()
        if weight:
            sums += torch.stack([loss.detach(), nll]).to(sums.dtype)
    runtime.all_reduce_sum_(sums)
    gnorm, lr = _apply_gradients(state, log=log)
    seconds = time.perf_counter() - tic
    loss, nll = sums.tolist() if host_stats else (sums[0], sums[1])
    return UpdateStats(loss=loss, nll=nll, tokens=ntokens, lr=lr, gnorm=gnorm, seconds=seconds)


def _apply_gradients(state: TrainState, *, log: Callable[[str], None]) -> tuple[float, float]:
    """Clip and step unless the gradient norm is not finite (the NaN guard); returns the norm and the update's rate."""
    t, optimizer, scaler = state.train_cfg, state.optimizer, state.scaler
    if scaler is not None:
        scaler.unscale_(optimizer)  # records the overflow for scaler.update()
    # The norm always (the NaN guard reads it); the clipping pass over every gradient only when asked for
    # (clip_grad_norm_ with an infinite max_norm still multiplies every gradient by 1.0).
    norm = torch.nn.utils.get_total_norm([p.grad for p in state.model.parameters() if p.grad is not None])
    if t.clip_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(state.model.parameters(), t.clip_norm, norm)
    gnorm = float(norm)  # the update's one host sync
    lr = state.scheduler.lr  # the schedule already set it for this update
    stepped = math.isfinite(gnorm)  # non-finite: an fp16 overflow (the scaler lowers its scale) or a NaN
    if stepped:
        optimizer.step()  # gradients already unscaled: scaler.step would only read the overflow flag again
        if state.ema is not None:  # a skipped update (overflow, NaN) leaves the average alone too
            state.ema.update()
    elif scaler is None:
        log(f"update {state.progress.update + 1}: gradient norm is {gnorm}; update skipped (NaN guard)")
    if scaler is not None:
        scaler.update()
    if stepped:  # a skipped update leaves the learning-rate schedule where it was
        state.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return gnorm, lr
