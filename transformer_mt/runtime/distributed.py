"""Data-parallel runs under torchrun: where this process sits (:class:`DistInfo`), joining the job, the DDP
wrapper, and the few collectives a run needs (run on rank 0 and share, rank 0 first, sum across ranks).

Without a process group every helper does the single-process thing (``on_main(fn)`` is ``fn()``), so the
training code calls them unconditionally.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np
import torch

from transformer_mt.errors import TmtError
from transformer_mt.runtime.device import RuntimeSetupError

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in a torchrun job (world_size 1 when not launched by torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info() -> DistInfo:
    """Read torchrun's environment variables (RANK, LOCAL_RANK, WORLD_SIZE)."""
    if "WORLD_SIZE" not in os.environ:
        return DistInfo()
    return DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


# ---------------------------------------------------------------- joining the job
# Ranks wait for each other at setup (rank 0 trains the tokenizer and encodes the corpus) and at
# every validation (rank 0 decodes the validation set): a long wait is normal, hence the timeout
# far above torch's default of 10 minutes for NCCL. A crashed rank does not leave the others
# waiting that long: torchrun stops all workers when one fails.
DIST_TIMEOUT_MINUTES = 60


class DistributedError(TmtError, RuntimeError):
    """Another rank of a distributed run failed; its message is repeated here."""


def seed_for_rank(seed: int, rank: int, update: int) -> int:
    """The seed of rank `rank` (> 0) of a run at `update`: a seed sequence, so (seed, rank) pairs never collide."""
    return int(np.random.SeedSequence([seed, rank, update]).generate_state(1, np.uint64)[0] >> 1)


def init_distributed(info: DistInfo, device: torch.device) -> tuple[torch.device, bool]:
    """Join the torchrun job: NCCL on CUDA (device cuda:LOCAL_RANK), Gloo on CPU.

    Returns (this rank's device, whether this call created the process group, so must destroy it);
    a group the caller already initialised is used as it is.
    """
    import datetime

    import torch.distributed as dist

    if device.type == "mps":
        raise RuntimeSetupError("distributed training does not support MPS; use train.device=cpu or CUDA GPUs")
    if device.type == "cuda":
        if info.local_rank >= torch.cuda.device_count():
            raise RuntimeSetupError(
                f"LOCAL_RANK={info.local_rank} but only {torch.cuda.device_count()} GPU(s) are visible; "
                "start at most that many processes per node (torchrun --nproc_per_node)"
            )
        device = torch.device("cuda", info.local_rank)  # one GPU per process, whatever index train.device named
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return device, False
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=DIST_TIMEOUT_MINUTES)
    )
    return device, True


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` in DistributedDataParallel, without syncing buffers at each forward: the model's buffers are
    the sinusoid table, a function of the config that rank 0 may grow while decoding, and with
    model.restrict_output the kept output ids, set alike on every rank before the model is wrapped.
    Parameters start equal on all ranks (same seed), and DDP broadcasts rank 0's at construction too."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    # torch 2.13 renamed the option; the older versions pyproject allows (torch >= 2.10) know only the old name
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return DistributedDataParallel(model, device_ids=device_ids, forward_sync_buffers=False)
    return DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)


def shutdown_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------- collectives


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _raise_shared(errors: list[tuple[int, str] | None], own: BaseException | None) -> None:
    """Raise this rank's own error, else the first other rank's as DistributedError; nothing if none failed."""
    if own is not None:
        raise own
    failed = [e for e in errors if e is not None]
    if failed:
        rank, message = failed[0]
        raise DistributedError(f"rank {rank} failed: {message}")


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 only and return its (picklable) result on every rank; without a process group,
    just `fn()`. When `fn` fails on rank 0, every rank raises (rank 0 its own error)."""
    if not _distributed():
        return fn()
    import torch.distributed as dist

    result, error, own = None, None, None
    if dist.get_rank() == 0:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
            own, error = exc, (0, str(exc))
    box = [(result, error)]
    dist.broadcast_object_list(box, src=0)
    result, error = box[0]
    _raise_shared([error], own)
    return cast(T, result)  # rank 0's fn() returned it: a failure raised above


def main_first(fn: Callable[[], T]) -> T:
    """Run `fn` on every rank: rank 0 first, then the first rank (LOCAL_RANK 0) of each other node, then
    the rest. Rank 0 writes a cache that the others then read; where nodes do not share the disk,
    each node's first rank writes its own copy.
    A failure on any rank is raised on every rank, so no rank waits for one that has stopped."""
    if not _distributed():
        return fn()
    import torch.distributed as dist

    rank, local_rank = dist.get_rank(), dist_info().local_rank
    stage_of_mine = 0 if rank == 0 else 1 if local_rank == 0 else 2
    result = None
    for stage in range(3):
        own, error = None, None
        if stage == stage_of_mine:
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
                own, error = exc, (rank, str(exc))
        errors: list = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        _raise_shared(errors, own)
    return cast(T, result)  # each rank ran fn() at its stage: a failure raised above


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, without reading it (NCCL queues the collective on the GPU
    like a kernel, so the host does not wait); the tensor itself without a group."""
    if _distributed():
        import torch.distributed as dist

        dist.all_reduce(tensor)
    return tensor


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sums over all ranks (float64: exact for token counts); the values themselves without a group."""
    if not _distributed():
        return list(values)
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()
