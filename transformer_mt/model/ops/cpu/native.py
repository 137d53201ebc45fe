"""The C++ kernels of a CPU training step, compiled on first use by torch's own extension builder.

- ``csrc/short_attention.cpp``: ``torch.ops.tmt.short_attention`` and its backward, a training step's attention over
  few keys, each (sentence, head) in one pass from the scores to the output
  (:func:`transformer_mt.model.ops.cpu.attention.short_attention` is its autograd form);
- ``csrc/residual.cpp``: the residual stream's dropout-and-add and ScaleNorm, forward and backward, one pass each;
- ``csrc/loss.cpp``: the fused loss's softmax over a chunk of logits rows, forward, backward, or both in one pass,
  each row read from memory once;
- ``csrc/random_words.cpp``: the dropout masks' random words, torch's own, drawn several times faster.

Each file's header says what it fuses and why. :class:`~transformer_mt.model.ops.cpu.CpuOps` calls them where they
apply and :func:`available` says they are built.

The build runs once per machine, at the first step that needs it (about 15 s), with ``torch.utils.cpp_extension``
and the system's C++ compiler, for the CPU it runs on (``-march=native``; the extension's name carries a hash of the
CPU's model and flags and of the sources, so a home directory shared by different machines keeps one build per
CPU). It is cached in :func:`build_directory`, torch's default place (``TORCH_EXTENSIONS_DIR``, by default under
``~/.cache/torch_extensions``). Without a compiler or ninja, or with ``TMT_NATIVE_KERNELS=0``, nothing is built:
:func:`available` is False, the callers keep their torch-op paths (the same numbers, slower on CPU), and one line on
stderr says why, once per process.

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

from transformer_mt import runtime

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

    runtime.put_pip_ninja_on_path()  # for a library caller that did not start through tmt or load()
    return _load(cpp_extension, extension_name())


def build_directory(name: str) -> Path:
    """Where the extension ``name`` is built and cached: torch's default place for it, made of torch's public
    parts (``TORCH_EXTENSIONS_DIR``, else the default root with a folder per Python and accelerator) and handed to
    ``cpp_extension.load``, so that the lock below guards the directory the build uses."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        if torch.version.hip is not None:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        elif torch.version.cuda is not None:
            accelerator = f"cu{torch.version.cuda.replace('.', '')}"
        else:
            accelerator = "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(cpp_extension.get_default_build_root(), f"{python}_{accelerator}")
    return Path(root) / name


def _load(cpp_extension: ModuleType, name: str, *, wait: float = BUILD_WAIT) -> bool:
    """Build (or load torch's cached build of) the kernels as ``name``, holding the build directory's lock; False,
    after one line on stderr, when they could not be built or the lock was not free within ``wait`` seconds."""
    build_dir = build_directory(name)
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with _build_lock(build_dir, wait=wait) as held:
            if not held:
                return False
            (build_dir / TORCH_LOCK).unlink(missing_ok=True)  # a killed build's: any live build holds the flock we hold
            return _compile(cpp_extension, name, build_dir)
    except OSError as exc:  # an unwritable build directory: what torch's build would have met
        _say_not_built(f"{build_dir}: {exc.strerror or exc}")
        return False


def _compile(cpp_extension: ModuleType, name: str, build_dir: Path) -> bool:
    if not any(build_dir.glob(f"{name}*.so")):  # one line before the first build, which takes a while
        print(f"tmt: compiling the C++ kernels for this CPU, once (about 15 s; cached in {build_dir})", file=sys.stderr)
    try:
        sources = [str(path) for path in SOURCES]
        cpp_extension.load(
            name=name,
            sources=sources,
            extra_cflags=CFLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
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
                    f"tmt: note: the C++ kernels were not loaded ({why}); training uses torch ops instead, "
                    f"slower on CPU (if that build hangs, end it and run again; {ENV_SWITCH}=0 skips the build)",
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
