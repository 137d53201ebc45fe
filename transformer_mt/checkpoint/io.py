"""Checkpoint files: the format, atomic save and safe load.

THE checkpoint format ("transformer_mt/1") is a dict of plain types only (tensors, dicts,
lists, tuples, str, int, float, bool, None), so it loads with ``torch.load(weights_only=True)``
and loading a file never runs code from it:

    format      "transformer_mt/1"; written by :func:`save_checkpoint`, checked by :func:`load_checkpoint`
    model       the model's ``state_dict()`` (parameter name -> tensor)
    config      ``config.to_dict(cfg)``: the whole resolved experiment configuration
    tokenizers  {"src": uint8 tensor, "tgt": uint8 tensor}: the sentencepiece model protos
                (the same proto twice for a joint vocabulary), and for an imported vocabulary
                "src_vocab" / "tgt_vocab": the piece of each id (list of str);
                see :func:`~transformer_mt.checkpoint.entries.pack_tokenizers`
    # training state; absent (or None) in inference checkpoints such as averages
    optimizer   ``optimizer.state_dict()``
    scheduler   ``scheduler.state_dict()``
    scaler      ``GradScaler.state_dict()`` or None when no loss scaling is used
    rng         :func:`~transformer_mt.checkpoint.rng.rng_state`: python / numpy / torch CPU / torch CUDA
                generator states
    progress    ``Progress.state_dict()`` (training/state.py): "update", "epoch", "batch_in_epoch" (batches consumed
                in the epoch), "best", "bad_validations" (patience count), "elapsed" (seconds), ...
    metrics     the last validation's results (loss, perplexity, BLEU, ...)
    ema         only with train.ema_decay > 0: ``EMA.state_dict()`` (training/ema.py), {"decay", "updates", "weights":
                {parameter name -> fp32 tensor}}; decoding takes these weights by default
                (:func:`~transformer_mt.checkpoint.weights.model_weights`)

Sentencepiece protos are stored as uint8 tensors, not ``bytes``: torch before 2.5 refuses
``bytes`` under weights_only (pytorch/pytorch#133163), and older checkpoints must keep loading.

``weights_only=True`` is only as safe as torch: it could be bypassed below torch 2.6
(CVE-2025-32434) and its unpickler could corrupt memory below 2.10 (CVE-2026-24747), so
:func:`load_checkpoint` refuses to read any checkpoint under a torch older than 2.10.

The rest of the package: the entries of a loaded checkpoint read back and checked, tokenizers and config
(entries.py), and the weights to decode with (weights.py); RNG state (rng.py), the numbered files of a run
directory and their pruning (retention.py), averaging into an inference checkpoint (averaging.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from transformer_mt.config import quote
from transformer_mt.errors import TmtError

FORMAT = "transformer_mt/1"


class CheckpointError(TmtError, RuntimeError):
    """A checkpoint problem worded for the user: one line naming the path and the fix."""


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` (plus the ``format`` key) to ``path`` atomically; returns the path.

    The bytes go to a temporary file in the same directory, which is flushed, fsynced and
    renamed over ``path`` (``os.replace`` is atomic on POSIX and Windows), then the directory
    is fsynced so the rename survives a power cut (fairseq's ``torch_persistent_save`` does
    the same dance). On any failure the temporary file is removed, whatever was at ``path``
    before is left untouched, and CheckpointError says why and what to do.
    """
    path = Path(path)
    _check_plain(state, "state")
    if (
        path.exists() and not path.is_file()
    ):  # os.replace would put a file in place of a directory entry, device or FIFO
        raise CheckpointError(f"{path}: exists and is not a regular file; give a file path for the checkpoint")
    payload = {"format": FORMAT, **{k: v for k, v in state.items() if k != "format"}}
    existed = path.is_file()
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Not tempfile.mkstemp: its files are mode 0600, and the checkpoint should get the umask's mode.
        tmp = str(path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "xb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: clean up, then let them through
            raise
        raise CheckpointError(_save_failure(path, exc, existed)) from exc
    _fsync_dir(path.parent)
    return path


def copy_checkpoint(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Write the bytes of the finished checkpoint ``source`` to ``path`` atomically (a copy fsynced and renamed
    into place, as :func:`save_checkpoint` does): one serialisation saved under several names (numbered, best,
    last). A copy, not a hard link: a later ``cp x.pt checkpoint_last.pt`` must not rewrite another name too."""
    source, path = Path(source), Path(path)
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path}: exists and is not a regular file; give a file path for the checkpoint")
    existed = path.is_file()
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, Exception):
            raise
        raise CheckpointError(_save_failure(path, exc, existed)) from exc
    _fsync_dir(path.parent)
    return path


def _save_failure(path: Path, exc: Exception, existed: bool) -> str:
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            fix = "free space or change train.out_dir"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = f"make {path.parent} writable or change train.out_dir"
        else:
            fix = "check the disk and train.out_dir"
    else:
        reason = f"{type(exc).__name__}: {exc}"
        fix = "this is a bug in what was saved or in transformer_mt; please report it"
    kept = "the previous checkpoint is intact" if existed else "no checkpoint was written"
    return f"could not save checkpoint to {path}: {reason}; {fix}; {kept}"


def _fsync_dir(directory: Path) -> None:
    """Persist a rename; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | os.PathLike, *, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, with ``torch.load(weights_only=True)``.

    ``mmap``: map the tensors' bytes from the file instead of reading them, so that their names, shapes and
    dtypes can be checked before any of them is read (a model's loader copies them out at once: a file
    truncated in place under a live mapping would fault on the next read).

    A missing, truncated or corrupt file, or a file that is not a transformer_mt checkpoint,
    raises CheckpointError naming the path and what to do.
    """
    _check_torch_is_safe()
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a checkpoint file" if path.is_dir() else "checkpoint not found"
        raise CheckpointError(
            f"{path}: {what}; give a .pt file from train.out_dir (checkpoint_last.pt, checkpoint_best.pt or "
            "checkpoint_<update>.pt)"
        )
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap and _is_zip(path))
    except Exception as exc:  # noqa: BLE001
        # torch raises RuntimeError, EOFError, UnpicklingError, ... depending on the damage
        text = str(exc)
        if "Weights only load failed" in text:
            raise CheckpointError(
                f"{path}: not a transformer_mt checkpoint (it holds Python objects that weights_only loading refuses); "
                "give a checkpoint written by `tmt train` or `tmt average`"
            ) from None
        # torch's own text runs to several sentences; its first one is the useful part.
        first = text.strip().splitlines()[0].split(". ")[0].rstrip(".") if text.strip() else type(exc).__name__
        reason = "the file is empty" if path.stat().st_size == 0 else first
        raise CheckpointError(
            f"{path}: checkpoint is truncated or corrupt ({reason}); use another one, e.g. checkpoint_last.pt "
            "or a numbered checkpoint_<update>.pt from the same run"
        ) from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(
            f"{path}: not a transformer_mt checkpoint (no 'format' key); give a checkpoint written by `tmt train` or "
            "`tmt average`"
        )
    if not isinstance(state["format"], str) or state["format"] != FORMAT:
        raise CheckpointError(
            f"{path}: checkpoint format {quote(state['format'])} is not {FORMAT!r}; use the transformer_mt version "
            "that wrote it"
        )
    return state


def _is_zip(path: Path) -> bool:
    """Whether ``path`` is in torch.save's zip format, the only one torch can map (other files are read whole,
    and torch's own error says what they are)."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


SAFE_TORCH = (2, 10)  # weights-only loading is safe from this version on (see the module docstring)


def _check_torch_is_safe(version: str | None = None) -> None:
    """Refuse to unpickle anything under a torch whose weights-only loader is known to be unsafe."""
    version = version or torch.__version__
    parts = re.match(r"(\d+)\.(\d+)", version)
    if parts is None or (int(parts.group(1)), int(parts.group(2))) < SAFE_TORCH:
        raise CheckpointError(
            f"torch {version} cannot load checkpoints safely (weights-only loading is unsafe below 2.10: "
            "CVE-2025-32434, CVE-2026-24747); upgrade with pip install 'torch>=2.10'"
        )


# Exact types: numpy.float64 subclasses float yet pickles as a numpy global that weights_only refuses.
_LEAF_TYPES = (str, int, float, bool, type(None), torch.dtype, torch.device)
_DICT_TYPES = (dict, OrderedDict)  # module.state_dict() is an OrderedDict
_SEQ_TYPES = (list, tuple, torch.Size)


def _check_plain(obj: Any, where: str) -> None:
    """Refuse, before writing anything, what ``torch.load(weights_only=True)`` would refuse later."""
    if type(obj) in _DICT_TYPES:
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise CheckpointError(
                    f"checkpoint {where} has a key {key!r} of type {type(key).__name__}; use str or int keys"
                )
            _check_plain(value, f"{where}[{key!r}]")
    elif type(obj) in _SEQ_TYPES:
        for i, value in enumerate(obj):
            _check_plain(value, f"{where}[{i}]")
    elif isinstance(obj, (bytes, bytearray)):
        raise CheckpointError(
            f"checkpoint {where} is bytes, which torch < 2.5 refuses under weights_only; store bytes_to_tensor(value) "
            "instead"
        )
    elif not (isinstance(obj, torch.Tensor) or type(obj) in _LEAF_TYPES):
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise CheckpointError(
            f"checkpoint {where} is a {kind}, which torch.load(weights_only=True) refuses; convert it to a tensor, "
            "str, int, float, bool, list or dict"
        )
