"""The process and its device: device choice, threads, seeding, the training dtype and autocast.

Data-parallel runs (torchrun, DDP, collectives) are :mod:`transformer_mt.runtime.distributed`.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

from transformer_mt.errors import TmtError


class RuntimeSetupError(TmtError, ValueError):
    """A device or precision request this machine cannot honour."""


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
            f"device '{name}' requested but this torch build sees no CUDA GPU; "
            "use --device cpu or install a CUDA build of torch (see README)"
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
    inputs, float32 accumulation: several times the float32 rate on Ampere and later; what
    ``torch.set_float32_matmul_precision("high")`` sets, here for CUDA alone so CPU numbers never change).
    bfloat16 / float16 autocast is unaffected. Returns ``device`` with its index (cuda -> cuda:current)."""
    if device.index is not None:
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # allow_tf32 before torch 2.9
    torch.backends.cudnn.allow_tf32 = True
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


# Where train.dtype "auto" picks bfloat16 on a CPU: the measured bfloat16 matmul peak must be at least
# this many times the float32 one (autocast's casts and the float32 softmax and loss eat part of the
# gain), and the model at least this wide (in a narrow model the matmuls are too small a share of an
# update to pay for the casts).
AUTO_BF16_CPU_SPEEDUP = 2.0
AUTO_BF16_CPU_MIN_D_MODEL = 256


def auto_dtype(device: torch.device, *, d_model: int) -> str:
    """What train.dtype "auto" means on this machine, for a model of width ``d_model``:

    - CUDA: bfloat16 where the GPU supports it (Ampere and later: tensor cores; no loss scaling needed),
      else float32 (with TF32 where the GPU has it);
    - CPU: bfloat16 only for models at least AUTO_BF16_CPU_MIN_D_MODEL wide on a CPU whose bfloat16
      matmul peak (measured once and cached, :func:`transformer_mt.runtime.flops.cached_peak`) is at least
      AUTO_BF16_CPU_SPEEDUP x its float32 peak (CPUs with bfloat16 matrix instructions, such as AMX or
      AVX512-BF16), else float32 (where bfloat16 matmuls are emulated they can run below the float32 rate);
    - anything else (MPS): float32.
    """
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type != "cpu" or d_model < AUTO_BF16_CPU_MIN_D_MODEL:
        return "float32"
    from transformer_mt.runtime.flops import cached_peak

    return (
        "bfloat16"
        if cached_peak("bfloat16", device=device) >= AUTO_BF16_CPU_SPEEDUP * cached_peak("float32", device=device)
        else "float32"
    )


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """The dtype of running sums kept on the device (training loss statistics): float64, as the host's
    Python floats they replace, except on MPS, which has none."""
    return torch.float32 if device.type == "mps" else torch.float64


def set_threads(threads: int) -> None:
    """0 keeps torch's default (one per physical core)."""
    if threads > 0:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (torch's on every device)."""
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
