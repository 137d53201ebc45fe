"""A run directory (``train.out_dir``) as `tmt train` uses it: one writer at a time, and no new run
silently started over an old one (which checkpoint a resume takes: policy.py).

- Lock. A training process holds an exclusive ``fcntl.flock`` on ``OUT_DIR/.lock`` (the file names its
  pid; a symlink there, or a file holding anything but a pid, is refused, never followed or truncated)
  from before it writes anything until it exits; the OS releases it when the process dies, even by
  SIGKILL. A second `tmt train` or `--resume` of the same directory gets one line naming that pid,
  instead of interleaving logs and pruning the first run's checkpoints.
- A new run refuses a directory that holds checkpoints, unless asked to start over (``--overwrite``),
  which removes the old run's checkpoints once the new run has passed every check (a refused run
  leaves the old one whole): numbered files of two runs would mix in pruning, in averaging and in
  finding the newest.
- Leftovers. Temporary files of checkpoints (and of metrics.jsonl) whose writer was killed are removed under the lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.checkpoint import numbered_checkpoints
from transformer_mt.errors import TmtError
from transformer_mt.training.finetuning import adapter_path

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment] # the module is absent: None marks "no locking"

LOCK_NAME = ".lock"
NAMED = ("checkpoint_last.pt", "checkpoint_best.pt")
# the temporaries of save_checkpoint / copy_checkpoint, and of RunLog.drop_after
_PID_LINE = re.compile(rb"(\d+\n?)?")  # what RunLock writes (empty when just created)
_TEMPORARY = re.compile(r"\.(checkpoint_(last|best|\d+)\.pt|metrics\.jsonl)\..+\.tmp")


class RunDirError(TmtError, RuntimeError):
    """A run directory that cannot be used as asked: one line naming it and the fix."""


class RunLock:
    """An exclusive lock on a run directory for the life of one training process (see the module docstring)."""

    def __init__(self, out_dir: str | os.PathLike):
        self.path = Path(out_dir) / LOCK_NAME
        self._fd: int | None = None
        if fcntl is None:
            return
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunDirError(
                f"{Path(out_dir)}: another tmt train (pid {holder}) is using this run directory; wait for it to end "
                f"or stop it, or set train.out_dir to another directory"
            ) from None
        content = os.pread(fd, 64, 0)
        if not _PID_LINE.fullmatch(content):  # never truncate what another program wrote under this name
            os.close(fd)
            raise RunDirError(
                f"{self.path}: exists and is not a tmt lock file (a pid line); move it away, or set train.out_dir to "
                "another directory"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (closing the file releases it; the file itself stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class RunDir:
    """The run directory as this process holds it: on rank 0 (`open`) its lock, and the previous run's checkpoints
    that --overwrite removes once the new run has passed every check; on the other ranks neither."""

    path: Path
    lock: RunLock | None = None
    old_run: list[Path] = field(default_factory=list)  # for remove_old_run

    @classmethod
    def open(cls, out: Path, *, resume: bool, overwrite: bool) -> RunDir:
        """Create and lock the directory before anything is written there, remove the temporaries of killed writers,
        and for a new run refuse a run already there unless `overwrite` (check_new_run)."""
        out.mkdir(parents=True, exist_ok=True)
        lock = RunLock(out)  # the holder's pid names a second process
        try:
            remove_stale_temporaries(out)
            old_run = [] if resume else check_new_run(out, overwrite=overwrite)
        except BaseException:
            lock.release()
            raise
        return cls(out, lock, old_run)

    def release(self) -> None:
        """Release the lock: the directory is free for another `tmt train`."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _open_lock_file(path: Path) -> int:
    """The lock file's descriptor; a symlink (which would lock and truncate its target) or anything but a
    regular file is refused."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise RunDirError(
            f"{path}: is not a regular file (a symlink, directory or device); remove it, or set train.out_dir to "
            "another directory"
        )
    return fd


def run_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints a run wrote into ``out_dir``: last, best and numbered ones (other .pt files are not the
    run's)."""
    out_dir = Path(out_dir)
    return [out_dir / name for name in NAMED if (out_dir / name).is_file()] + numbered_checkpoints(out_dir)


def check_new_run(out_dir: str | os.PathLike, *, overwrite: bool) -> list[Path]:
    """Before a new run writes into ``out_dir`` (under its lock): refuse one that holds a run unless
    ``overwrite``; returns that run's checkpoints, which :func:`remove_old_run` deletes once the new run has
    passed every check (a refused new run leaves the old one whole)."""
    found = run_checkpoints(out_dir)
    if found and not overwrite:
        names = ", ".join(p.name for p in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise RunDirError(
            f"{out_dir} already holds a run ({names}); continue it with `tmt train --resume {out_dir}`, "
            "start it over with --overwrite, or set train.out_dir to a new directory"
        )
    return found


def remove_old_run(found: list[Path]) -> int:
    """Delete the old run's checkpoints :func:`check_new_run` found (and a LoRA run's adapter files beside them);
    returns how many checkpoints were there."""
    for path in found:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        adapter_path(path).unlink(missing_ok=True)  # a LoRA run's adapter file beside it
    return len(found)


def remove_stale_temporaries(out_dir: str | os.PathLike) -> int:
    """Delete the temporary files of checkpoint writes that never finished (their process was killed);
    only under the run's lock, when no other process can be writing one. Returns how many."""
    out_dir, removed = Path(out_dir), 0
    if out_dir.is_dir():
        for path in out_dir.iterdir():
            if _TEMPORARY.fullmatch(path.name):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
    return removed
