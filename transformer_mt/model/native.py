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

One process builds at a time per build directory: it holds an ``flock`` on :data:`BUILD_LOCK` there, which the
kernel releases when the holder ends, however it ends. torch's own lock (its ``FileBaton``, a ``lock`` file that
exists while a build runs) is left behind by a build killed midway (OOM, SIGKILL), and torch then waits on it
forever; whoever holds the flock knows no build is running and removes it. Another process waits for the flock at
most :data:`BUILD_WAIT` seconds (SIGTERM or Ctrl-C ends the wait too), then trains with the torch ops and says so in
one line naming the directory and the process that holds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in ("short_attention.cpp", "residual.cpp", "loss.cpp", "random_words.cpp")
]
CFLAGS = ["-O3", "-march=native", "-fopenmp"]  # -fopenmp: at::parallel_for runs on torch's OpenMP threads
ENV_SWITCH = "TMT_NATIVE_KERNELS"  # "0": never build or load
BUILD_LOCK = "tmt_build.lock"  # in the build directory: flocked by the process that builds, holding "PID HOST"
BUILD_WAIT = 600.0  # seconds a process waits for another's build before training with the torch ops
QUIET_WAIT = 10.0  # seconds of that wait before it is announced (a cached build loads well within it)
TORCH_LOCK = "lock"  # torch's FileBaton in the build directory (torch.utils.cpp_extension._jit_compile)

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
    files = hashlib.sha256(
        b"".join(path.read_bytes() for path in sorted(SOURCES[0].parent.iterdir()) if path.suffix in (".cpp", ".h"))
    )
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
    if hasattr(
        torch.ops.tmt, "softmax_rows_backward_"
    ):  # registered already (loaded under another name in this process)
        return True
    from torch.utils import cpp_extension

    _put_pip_ninja_on_path()
    return _load(cpp_extension, extension_name())


def _load(cpp_extension: ModuleType, name: str, *, wait: float = BUILD_WAIT) -> bool:
    """Build (or load torch's cached build of) the kernels as ``name``, holding the build directory's lock; False,
    after one line on stderr, when they could not be built or the lock was not free within ``wait`` seconds."""
    try:
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))  # where load() builds and caches
    except (AttributeError, OSError, RuntimeError):  # a torch without this helper: its own lock alone
        return _compile(cpp_extension, name, None)
    try:
        with _build_lock(build_dir, wait=wait) as held:
            if not held:
                return False
            (build_dir / TORCH_LOCK).unlink(missing_ok=True)  # a killed build's: any live build holds the flock we hold
            return _compile(cpp_extension, name, build_dir)
    except OSError as exc:  # an unwritable build directory: what torch's build would have met
        _say_not_built(f"{build_dir}: {exc.strerror or exc}")
        return False


def _compile(cpp_extension: ModuleType, name: str, build_dir: Path | None) -> bool:
    if build_dir is not None and not any(
        build_dir.glob(f"{name}*.so")
    ):  # one line before the first build, which takes a while
        print(f"tmt: compiling the C++ kernels for this CPU, once (about 15 s; cached in {build_dir})", file=sys.stderr)
    try:
        sources = [str(path) for path in SOURCES]
        cpp_extension.load(
            name=name,
            sources=sources,
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _say_not_built(reason)
        return False
    return True


def _say_not_built(reason: str) -> None:
    print(
        f"tmt: note: the C++ kernels could not be built ({reason[:200]}); training uses torch ops instead, "
        f'slower on CPU (needs a C++ compiler and ninja: pip install -e ".[fast]"; {ENV_SWITCH}=0 skips the build)',
        file=sys.stderr,
    )


@contextlib.contextmanager
def _build_lock(build_dir: Path, *, wait: float) -> Iterator[bool]:
    """Inside the block, True while this process holds ``build_dir``'s :data:`BUILD_LOCK`; False (one line said why)
    when another process held it for ``wait`` seconds or a signal ended the wait. Without ``fcntl`` (Windows):
    True, torch's own lock alone."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    path = build_dir / BUILD_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not _try_flock(fcntl, fd):
            holder = _holder(path)
            # silent at first: the ranks of one run start together, and all but one wait a moment for its load
            quiet = min(QUIET_WAIT, wait)
            stopped = _wait_for_flock(fcntl, fd, quiet)
            if stopped is None and not _try_flock(fcntl, fd):
                print(
                    f"tmt: waiting for {holder}, which builds the C++ kernels in {build_dir} (at most {wait:g} s)",
                    file=sys.stderr,
                )
                stopped = _wait_for_flock(fcntl, fd, wait - quiet)
            if stopped is not None or not _try_flock(fcntl, fd):
                why = f"{stopped} ended the wait" if stopped else f"{holder} still holds {path} after {wait:g} s"
                print(
                    f"tmt: note: the C++ kernels were not loaded ({why}); training uses torch ops instead, slower on CPU "
                    f"(if that build hangs, end it and run again; {ENV_SWITCH}=0 skips the build)",
                    file=sys.stderr,
                )
                yield False
                return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {platform.node()}".encode())
        try:
            yield True
        finally:
            os.ftruncate(fd, 0)  # then closing the file releases the flock
    finally:
        os.close(fd)


def _try_flock(fcntl: ModuleType, fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for_flock(fcntl: ModuleType, fd: int, wait: float) -> str | None:
    """Poll for the flock for at most ``wait`` seconds: None when it was taken or the time ran out, else the name
    of the signal that ended the wait."""
    deadline = time.monotonic() + wait
    with _signals_end_the_wait() as received:
        while not received and time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            if not received and _try_flock(fcntl, fd):
                return None
    return signal.Signals(received[0]).name if received else None


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[list[int]]:
    """SIGTERM and SIGINT received inside the block are listed in what it yields, and their earlier handlers still
    run: a training run's (which asks the run to stop and returns) or Python's (KeyboardInterrupt); a signal left to
    the system's default action ends the process, as it would have. No handler is installed outside the main thread."""
    received: list[int] = []
    previous: dict[int, Any] = {}  # signal -> the handler getsignal returned

    def handler(signum, frame):
        received.append(signum)
        before = previous[signum]
        if callable(before):
            before(signum, frame)
        elif before == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                previous[sig] = signal.getsignal(sig)
                signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _holder(path: Path) -> str:
    """Who holds the build lock, as its file says ("pid 123 on HOST"), or "another process"."""
    try:
        pid, _, host = path.read_text(encoding="utf-8", errors="replace")[:200].partition(" ")
        return f"pid {int(pid)}" + (
            f" on {host.strip()[:60]}" if host.strip() and host.strip() != platform.node() else ""
        )
    except (OSError, ValueError):
        return "another process"


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
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, causal: bool, scale: float
    ) -> Tensor:  # autograd's signature: ctx untyped
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
        ctx,
        q_base: Tensor,
        kv_base: Tensor | None,
        geometry: tuple[Geometry, Geometry, Geometry],
        allowed: Tensor | None,
        causal: bool,
        scale: float,
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
        views = [
            (_view(base, geom), _view(g, geom))
            for base, g, geom in zip((q_base, kv, kv), (grad_q, grad_kv, grad_kv), ctx.geometry)
        ]
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
    return (
        spans[0][0] == 0
        and all(a + n == c for (a, n), (c, _) in zip(spans, spans[1:]))
        and spans[-1][0] + spans[-1][1] == row
    )


def short_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, scale: float) -> Tensor:
    """q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv), float32 on CPU, each with a contiguous last dimension;
    ``allowed`` (B, K) bool, True = attend, or None; ``causal``: query t sees keys 0..t -> (B, T, H * Dv).

    Where q, k and v are the heads of fused projections (self-attention's (q, k, v), cross-attention's q and (k, v)),
    the gradient goes to the projections whole. Needs :func:`available`; head sizes multiples of 16, 1 to 64 keys (the
    kernel checks and raises otherwise)."""
    qb, kb = q._base, k._base
    if qb is not None and qb is kb and _tiled(qb, q, k, v):  # self-attention
        return _ShortAttentionOnProjections.apply(
            qb, None, (_geometry(q, qb), _geometry(k, qb), _geometry(v, qb)), allowed, causal, scale
        )
    if qb is not None and kb is not None and qb is not kb and _tiled(qb, q) and _tiled(kb, k, v):  # cross-attention
        return _ShortAttentionOnProjections.apply(
            qb, kb, (_geometry(q, qb), _geometry(k, kb), _geometry(v, kb)), allowed, causal, scale
        )
    return _ShortAttention.apply(q, k, v, allowed, causal, scale)
