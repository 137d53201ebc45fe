"""Process-level setup: device choice, threads, seeding, autocast, torchrun detection."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch


class RuntimeSetupError(ValueError):
    """A device or precision request this machine cannot honour."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    """`auto` picks CUDA, then Apple MPS, then CPU; an explicit name is checked to exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise RuntimeSetupError(f"device '{name}' is not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeSetupError(f"device '{name}' requested but this torch build sees no CUDA GPU; use --device cpu or install a CUDA build of torch (see README)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeSetupError(f"device '{name}' requested but only {torch.cuda.device_count()} GPU(s) are visible")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RuntimeSetupError(f"device '{name}' requested but MPS is not available; use --device cpu")
    return device


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
