"""The C++ kernels' build is one process at a time per build directory, and no process waits on it forever: a build
killed midway (OOM, SIGKILL) does not stop the next one, a live build is waited for at most a bounded time, and
SIGTERM or Ctrl-C ends the wait.

torch's own builder (``torch.utils.cpp_extension.load``) runs here for real, with its two steps that need a compiler
(writing and running the ninja build, importing the library) replaced by ones that record the call; the build
directory's lock is held by a separate Python process, as another ``tmt train`` would hold it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from transformer_mt.model.ops.cpu import native

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the build lock is an flock (POSIX)")

NAME = "tmt_kernels_locktest"
TORCH_LOCK = "lock"  # torch's FileBaton: created when a build starts, removed when it ends, left behind by a killed one


@pytest.fixture
def fake_compiler(monkeypatch, tmp_path) -> tuple[Path, list[str]]:
    """(the build directory of NAME under a fresh TORCH_EXTENSIONS_DIR, the names torch built, in order)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    built: list[str] = []
    monkeypatch.setattr(cpp_extension, "_write_ninja_file_and_build_library", lambda *, name, **_: built.append(name))
    monkeypatch.setattr(cpp_extension, "_import_module_from_library", lambda *args: None)
    build_dir = native.build_directory(NAME)
    build_dir.mkdir(parents=True)
    return build_dir, built


@contextmanager
def build_in_progress(build_dir: Path) -> Iterator[subprocess.Popen]:
    """Another process building in ``build_dir``: it holds tmt's lock and has created torch's, as a build does until
    it ends; it waits until killed."""
    code = (
        "import fcntl, os, sys, time\n"
        f"f = open({str(build_dir / native.BUILD_LOCK)!r}, 'a+')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.truncate(0); f.write(f'{os.getpid()} {os.uname().nodename}'); f.flush()\n"
        f"open({str(build_dir / TORCH_LOCK)!r}, 'x').close()\n"
        "print('building', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "building\n"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=30)


@contextmanager
def unblocked_after(build_dir: Path, seconds: float) -> Iterator[None]:
    """A safety net for a build that would wait forever on torch's lock: it is removed after ``seconds``."""
    timer = threading.Timer(seconds, (build_dir / TORCH_LOCK).unlink, kwargs={"missing_ok": True})
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_a_build_killed_midway_leaves_no_lock_that_stops_the_next(fake_compiler):
    build_dir, built = fake_compiler
    with build_in_progress(build_dir) as holder:
        holder.send_signal(signal.SIGKILL)  # an OOM kill: no cleanup runs
        holder.wait(timeout=30)
    assert (build_dir / TORCH_LOCK).exists()  # what torch's FileBaton leaves behind
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(native._load(cpp_extension, NAME)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "still waiting on the lock file of a build that was killed"
    assert result == [True] and built == [NAME] and not (build_dir / TORCH_LOCK).exists()


def test_a_live_build_is_waited_for_at_most_the_timeout_then_one_line(fake_compiler, capsys):
    build_dir, built = fake_compiler
    with build_in_progress(build_dir) as holder, unblocked_after(build_dir, 30):
        tic = time.monotonic()
        assert native._load(cpp_extension, NAME, wait=1.0) is False
        assert time.monotonic() - tic < 20  # answered within a bound, not after the other build
        assert (build_dir / TORCH_LOCK).exists()  # a live build's lock is not taken from it
    assert built == []
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tmt: note:")]
    assert len(notes) == 1, notes
    assert (
        str(build_dir) in notes[0]
        and f"pid {holder.pid}" in notes[0]
        and f"{native.ENV_SWITCH}=0" in notes[0]
        and "torch ops" in notes[0]
    )


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals are handled in the main thread only"
)
def test_sigterm_ends_the_wait_and_still_reaches_the_runs_own_handler(fake_compiler, capsys):
    """A training run's handler asks the run to stop and returns: the wait must end all the same."""
    build_dir, built = fake_compiler
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with build_in_progress(build_dir), unblocked_after(build_dir, 30):
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            tic = time.monotonic()
            assert native._load(cpp_extension, NAME, wait=120.0) is False
            assert time.monotonic() - tic < 20
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == [signal.SIGTERM] and built == []
    assert "SIGTERM" in capsys.readouterr().err


@pytest.mark.parametrize("root", [None, "extensions"])
def test_the_build_directory_is_torchs_own_default(root, monkeypatch, tmp_path):
    """The directory handed to cpp_extension.load is the one torch picks by itself (its private helper, read here only
    to compare), so that a cache built before stays in use; with TORCH_EXTENSIONS_DIR and without."""
    if root is None:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # torch's default root, out of the real cache
    else:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / root))
    assert native.build_directory(NAME) == Path(cpp_extension._get_build_directory(NAME, verbose=False))
