"""C++ kernels for a CPU training step, compiled on first use by torch's own extension builder.

- ``csrc/short_attention.cpp``: ``torch.ops.tmt.short_attention`` and its backward, a training step's attention over
  few keys, each (sentence, head) in one pass from the scores to the output. :func:`short_attention` is its
  autograd form; :mod:`transformer_mt.model.attention` calls it where it applies.
- ``csrc/residual.cpp``: the residual stream's dropout-and-add and ScaleNorm, forward and backward, one pass each;
  ``csrc/loss.cpp``: the fused loss's softmax over a chunk of logits rows, forward, backward, or both in one pass,
  each row read from memory once; ``csrc/random_words.cpp``: the dropout masks' random words, torch's own, drawn
  several times faster. :mod:`transformer_mt.model.kernels` and :mod:`transformer_mt.model.fused_loss` call them.

Each file's header says what it fuses and why.

The build runs once per machine, at the first step that needs it (about 15 s), with ``torch.utils.cpp_extension``
and the system's C++ compiler, for the CPU it runs on (``-march=native``; the extension's name carries a hash of the
CPU's model and flags and of the sources, so a home directory shared by different machines keeps one build per CPU).
torch caches it under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). Without a compiler or ninja, or with
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
from types import ModuleType

import torch
from torch import Tensor

SOURCES = [Path(__file__).parent / "csrc" / name for name in ("short_attention.cpp", "residual.cpp", "loss.cpp", "random_words.cpp")]
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
    _say_if_compiling(cpp_extension, name)
    try:
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


def _say_if_compiling(cpp_extension: ModuleType, name: str) -> None:
    """One line before the first build on this machine, which takes a while; nothing when torch's cache has it."""
    try:
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))  # where load() builds and caches
    except (AttributeError, OSError, RuntimeError):  # a torch without this helper: build without the line
        return
    if not any(build_dir.glob(f"{name}*.so")):
        print(f"tmt: compiling the C++ kernels for this CPU, once (about 15 s; cached in {build_dir})", file=sys.stderr)


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
        gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.tmt.short_attention_backward(grad, q, k, v, probs, ctx.scale, gq, gk, gv)
        return gq, gk, gv, None, None, None


Geometry = tuple[tuple[int, ...], tuple[int, ...], int]  # a view's size, stride and offset in its base


class _ShortAttentionOnProjections(torch.autograd.Function):
    """:class:`_ShortAttention` taking the projections q, k and v are views of, (B, T, W) each: self-attention's one
    fused (q, k, v) matrix (``kv_base`` None), or cross-attention's queries and fused (k, v). Their gradients are
    written into one buffer per projection, in the views' places, instead of three tensors that the views' backward
    (a split's) would copy together."""

    @staticmethod
    def forward(
        ctx, q_base: Tensor, kv_base: Tensor | None, geometry: tuple[Geometry, Geometry, Geometry], allowed: Tensor | None, causal: bool, scale: float
    ) -> Tensor:  # autograd's signature: ctx untyped
        kv = q_base if kv_base is None else kv_base
        q, k, v = (_view(base, geom) for base, geom in zip((q_base, kv, kv), geometry))
        out, probs = torch.ops.tmt.short_attention(q, k, v, allowed, causal, scale)
        ctx.save_for_backward(q_base, kv_base, probs)
        ctx.geometry, ctx.scale = geometry, scale
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        q_base, kv_base, probs = ctx.saved_tensors
        kv = q_base if kv_base is None else kv_base
        grad_q = torch.empty_like(q_base)
        grad_kv = grad_q if kv_base is None else torch.empty_like(kv_base)
        views = [(_view(base, geom), _view(g, geom)) for base, g, geom in zip((q_base, kv, kv), (grad_q, grad_kv, grad_kv), ctx.geometry)]
        (q, gq), (k, gk), (v, gv) = views
        torch.ops.tmt.short_attention_backward(grad, q, k, v, probs, ctx.scale, gq, gk, gv)
        return grad_q, None if kv_base is None else grad_kv, None, None, None, None


def _geometry(view: Tensor, base: Tensor) -> Geometry:
    return tuple(view.shape), view.stride(), int(view.storage_offset() - base.storage_offset())


def _view(base: Tensor, geometry: Geometry) -> Tensor:
    """The view of ``base`` that ``geometry`` describes (its offset is from the base's own start)."""
    size, stride, offset = geometry
    return base.as_strided(size, stride, base.storage_offset() + offset)


def _tiled(base: Tensor | None, *views: Tensor) -> bool:
    """Whether ``views`` (B, T, H, d) of a contiguous ``base`` with rows of W (a (B * T, W) or (B, T, W) projection
    output) lie side by side and cover each of its rows, as the heads of a fused projection's parts do."""
    if base is None or not base.is_contiguous() or any(v._base is not base for v in views):
        return False
    if any(v.requires_grad and not base.requires_grad for v in views):  # a base outside the graph would cut it here
        return False
    row = base.size(-1)
    for v in views:
        b, t, _, d = v.shape
        if v.stride() != (t * row, row, d, 1) or b * t * row != base.numel():
            return False
    spans = sorted((v.storage_offset() - base.storage_offset(), v.size(2) * v.size(3)) for v in views)
    return spans[0][0] == 0 and all(a + n == c for (a, n), (c, _) in zip(spans, spans[1:])) and spans[-1][0] + spans[-1][1] == row


def short_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, scale: float) -> Tensor:
    """q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv), float32 on CPU, each with a contiguous last dimension;
    ``allowed`` (B, K) bool, True = attend, or None; ``causal``: query t sees keys 0..t -> (B, T, H * Dv).

    Where q, k and v are the heads of fused projections (self-attention's (q, k, v), cross-attention's q and (k, v)),
    the gradient goes to the projections whole. Needs :func:`available`; head sizes multiples of 16, 1 to 64 keys (the
    kernel checks and raises otherwise)."""
    qb, kb = q._base, k._base
    if qb is not None and qb is kb and _tiled(qb, q, k, v):  # self-attention
        return _ShortAttentionOnProjections.apply(qb, None, (_geometry(q, qb), _geometry(k, qb), _geometry(v, qb)), allowed, causal, scale)
    if qb is not None and kb is not None and qb is not kb and _tiled(qb, q) and _tiled(kb, k, v):  # cross-attention
        return _ShortAttentionOnProjections.apply(qb, kb, (_geometry(q, qb), _geometry(k, kb), _geometry(v, kb)), allowed, causal, scale)
    return _ShortAttention.apply(q, k, v, allowed, causal, scale)
