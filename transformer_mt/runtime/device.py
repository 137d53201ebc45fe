"""Process-level setup: device choice, threads, seeding, autocast, torchrun detection and the few
collectives a data-parallel run needs (join the job, run on rank 0 and share, sum across ranks)."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np
import torch

from transformer_mt.errors import TmtError


class RuntimeSetupError(TmtError, ValueError):
    """A device or precision request this machine cannot honour."""


T = TypeVar("T")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    """`auto` picks CUDA, then Apple MPS, then CPU; an explicit name is checked to exist.
    A CUDA device is also made ready (:func:`use_cuda`): current device, TF32 for float32 matmuls."""
    if name == "auto":
        if torch.cuda.is_available():
            return use_cuda(torch.device("cuda"))
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise RuntimeSetupError(f"device '{name}' is not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeSetupError(
            f"device '{name}' requested but this torch build sees no CUDA GPU; use --device cpu or install a CUDA build of torch (see README)"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeSetupError(f"device '{name}' requested but only {torch.cuda.device_count()} GPU(s) are visible")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RuntimeSetupError(f"device '{name}' requested but MPS is not available; use --device cpu")
    return use_cuda(device) if device.type == "cuda" else device


def use_cuda(device: torch.device) -> torch.device:
    """Make a CUDA device ready for work: ``cuda:N`` becomes the current device (``torch.cuda.set_device``:
    otherwise kernels launched without an explicit device, the caching allocator's default and NCCL's
    communicator would use cuda:0), and float32 matmuls may use TF32 tensor cores (10-bit mantissa
    inputs, float32 accumulation: ~8x the float32 rate on Ampere and later; what
    ``torch.set_float32_matmul_precision("high")`` sets, here for CUDA alone so CPU numbers never change).
    bfloat16 / float16 autocast is unaffected. Returns ``device`` with its index (cuda -> cuda:current)."""
    if device.index is not None:
        torch.cuda.set_device(device)
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9 names the precision; allow_tf32 is its older spelling
        matmul.fp32_precision = "tf32"
    else:
        matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


# Where train.dtype "auto" picks bfloat16 on a CPU: the measured bfloat16 matmul peak must be at least
# this many times the float32 one (autocast's casts and the float32 softmax and loss eat part of the
# gain), and the model at least this wide. Measured: the recipe, d_model 128, trained at 5,247 target
# tokens/s in bf16 against 9,601 in float32 on a Xeon with AMX whose bf16 matmul peak was 6.7x float32's;
# on an AMD EPYC with AVX512-BF16 (bf16 peak 4.2x float32's, scripts/benchmark.py, one run) the recipe
# trained at 5,935 in bf16 against 5,983, and the 3+3/d256 reference at 4,301 against 3,218 (1.34x).
AUTO_BF16_CPU_SPEEDUP = 2.0
AUTO_BF16_CPU_MIN_D_MODEL = 256


def auto_dtype(device: torch.device, *, d_model: int) -> str:
    """What train.dtype "auto" means on this machine, for a model of width ``d_model``:

    - CUDA: bfloat16 where the GPU supports it (Ampere and later: tensor cores; no loss scaling needed),
      else float32 (with TF32 where the GPU has it);
    - CPU: bfloat16 only for models at least AUTO_BF16_CPU_MIN_D_MODEL wide on a CPU whose bfloat16
      matmul peak (measured once and cached, :func:`transformer_mt.runtime.flops.cached_peak`) is at least
      AUTO_BF16_CPU_SPEEDUP x its float32 peak (CPUs with AMX); without AMX bf16 GEMMs run at about half
      the float32 rate, so float32;
    - anything else (MPS): float32.
    """
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type != "cpu" or d_model < AUTO_BF16_CPU_MIN_D_MODEL:
        return "float32"
    from transformer_mt.runtime.flops import cached_peak

    return "bfloat16" if cached_peak("bfloat16", device=device) >= AUTO_BF16_CPU_SPEEDUP * cached_peak("float32", device=device) else "float32"


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """The dtype of running sums kept on the device (training loss statistics): float64, as the host's
    Python floats they replace, except on MPS, which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


def set_threads(threads: int) -> None:
    """0 keeps torch's default (one per physical core)."""
    if threads > 0:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def check_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The torch dtype for a precision name, refusing combinations the device cannot run."""
    if dtype not in DTYPES:
        raise RuntimeSetupError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")
    if dtype == "float16" and device.type == "cpu":
        raise RuntimeSetupError("float16 needs a GPU (loss scaling on CUDA); on CPU use bfloat16 or float32")
    if dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise RuntimeSetupError("this GPU does not support bfloat16; use float16 or float32")
    return DTYPES[dtype]


def autocast(device: torch.device, dtype: str):
    """Mixed precision context: autocast for bfloat16/float16, a no-op for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


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


# ---------------------------------------------------------------- distributed data parallel
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
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=DIST_TIMEOUT_MINUTES))
    return device, True


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` in DistributedDataParallel, without syncing buffers at each forward: the model's only
    buffer, the sinusoid table, is a function of the config, and rank 0 may grow it while decoding.
    Parameters start equal on all ranks (same seed), and DDP broadcasts rank 0's at construction too."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    # torch 2.13 renamed the option; older versions (the toolkit supports >= 2.2) know only the old name
    no_buffer_sync = (
        {"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync)


def shutdown_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


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
    return result


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
    return result  # type: ignore[return-value]


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
