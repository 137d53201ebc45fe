"""C++ kernels for a CPU training step, compiled on first use by torch's own extension builder.

- ``csrc/short_attention.cpp``: ``torch.ops.tmt.short_attention`` and its backward, a training step's attention over
  few keys, each (sentence, head) in one pass from the scores to the output. :func:`short_attention` is its
  autograd form; :mod:`transformer_mt.model.attention` calls it where it applies.
- ``csrc/residual.cpp``: the residual stream's dropout-and-add and ScaleNorm, forward and backward, one pass each;
  ``csrc/loss.cpp``: the fused loss's softmax over a chunk of logits rows, forward and backward, each row read from
  memory once. :mod:`transformer_mt.model.kernels` calls them.

Each file's header says what it fuses and why.

The build runs once per machine, at the first step that needs it (about 15 s), with ``torch.utils.cpp_extension``
and the system's C++ compiler, for the CPU it runs on (``-march=native``; the extension's name carries a hash of the
CPU's model and flags, so a home directory shared by different machines keeps one build per CPU, and of the sources). torch caches it
under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). Without a compiler or ninja, or with
``TMT_NATIVE_KERNELS=0``, nothing is built: :func:`available` is False, the callers keep their torch-op paths (the
same numbers, slower on CPU), and one line on stderr says why, once per process.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import Tensor

SOURCES = [Path(__file__).parent / "csrc" / name for name in ("short_attention.cpp", "residual.cpp", "loss.cpp")]
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # -fopenmp: at::parallel_for runs on torch's OpenMP threads
ENV_SWITCH = "TMT_NATIVE_KERNELS"  # "0": never build or load

_lock = threading.Lock()
_loaded: list[bool] = []  # [] before the first try, then [whether the ops are registered]


def _cpu_tag() -> str:
    """A short hash of this CPU's model name and instruction-set flags (Linux; the machine name elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
        text = "\n".join(lines) or platform.processor()
    except OSError:
        text = platform.processor() or platform.machine()
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def extension_name() -> str:
    """The name torch builds and caches the kernels under on this CPU: with a hash of every file in csrc/, since torch
    rebuilds when a listed source changes but not when a header they include does."""
    files = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(SOURCES[0].parent.iterdir()) if path.suffix in (".cpp", ".h")))
    return f"tmt_kernels_{_cpu_tag()}_{files.hexdigest()[:8]}"


def available() -> bool:
    """Whether the ``torch.ops.tmt`` kernels can run: builds or loads them on the first call."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_build())
    return _loaded[0]


def _build() -> bool:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    if hasattr(torch.ops.tmt, "softmax_rows_backward_"):  # registered already (loaded under another name in this process)
        return True
    from torch.utils import cpp_extension

    _put_pip_ninja_on_path()
    name = extension_name()
    try:
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))  # where load() builds and caches
        if not any(build_dir.glob(f"{name}*.so")):
            print(f"tmt: compiling the C++ kernels for this CPU, once (about 15 s; cached in {build_dir})", file=sys.stderr)
        sources = [str(path) for path in SOURCES]
        cpp_extension.load(name=name, sources=sources, extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"tmt: note: the C++ kernels could not be built ({reason[:200]}); training uses torch ops instead, "
            f'slower on CPU (needs a C++ compiler and ninja: pip install -e ".[fast]"; {ENV_SWITCH}=0 skips the build)',
            file=sys.stderr,
        )
        return False
    return True


def _put_pip_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the ``fast`` extra's pip package puts it in the environment's bin folder,
    which is not on PATH when a virtual environment's python runs without being activated."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja  # the `fast` extra
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


class _ShortAttention(torch.autograd.Function):
    """softmax(scale * q k^T, masked) v over heads, as (B, T, H * Dv); gradients for q, k and v."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, causal: bool, scale: float) -> Tensor:  # autograd's signature: ctx untyped
        out, probs = torch.ops.tmt.short_attention(q, k, v, allowed, causal, scale)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        q, k, v, probs = ctx.saved_tensors
        gq, gk, gv = torch.ops.tmt.short_attention_backward(grad, q, k, v, probs, ctx.scale)
        return gq, gk, gv, None, None, None


def short_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, scale: float) -> Tensor:
    """q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv), float32 on CPU, each with a contiguous last dimension;
    ``allowed`` (B, K) bool, True = attend, or None; ``causal``: query t sees keys 0..t -> (B, T, H * Dv).

    Needs :func:`available`; head sizes multiples of 16, 1 to 64 keys (the kernel checks and raises otherwise)."""
    return _ShortAttention.apply(q, k, v, allowed, causal, scale)
