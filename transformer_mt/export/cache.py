"""The conversion cache of ``--engine ctranslate2``: a checkpoint is converted once, and the CTranslate2 model
directory is kept beside it (``<checkpoint>.ct2/``; ``<checkpoint>.<weights>.ct2/`` with ``--weights``).

The directory is an ordinary ``tmt export`` (written into a temporary directory and renamed into place, so a
crash never leaves half a cache), whose ``tmt_export.json`` also records what it was converted from
(:data:`CACHE_KEY`): the checkpoint's size, times (modification and status change) and sha256, the weights asked
for, and the tmt and CTranslate2 versions that wrote it. A cache is reused while all of them still hold. While the
size and both times match, the checkpoint is not read again (writing a file, or renaming one into place as tmt
does, changes its status-change time, which no program can set back); when a time differs, the sha256 decides,
and a cache it finds fresh gets the new times. Anything else is rebuilt.

A checkpoint in a directory this process cannot write keeps its cache under ``$TMT_CACHE_DIR/ctranslate2/``
(default ``~/.cache/tmt``), named by the checkpoint's absolute path, with a one-line note saying so; so does one
whose ``<checkpoint>.ct2`` the cache did not write (the user's own ``tmt export -o CKPT.ct2 -q int8``, say) or holds
a file changed since: the cache replaces only a conversion of its own whose files are as it wrote them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_mt import __version__
from transformer_mt.checkpoint import EXPORT_MARKER, file_sha256, load_checkpoint, output_problem
from transformer_mt.export.ctranslate2 import export_ctranslate2, require_ctranslate2
from transformer_mt.export.errors import ExportError

CACHE_KEY = "converted_from"  # the key of tmt_export.json that holds what a cache was converted from
CACHE_FORMAT = (
    1  # what the conversion writes for the engine (padding and BOS never generated); a new one rebuilds every cache
)
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


@dataclass(frozen=True)
class CachedModel:
    """A converted model ready to load: its directory, what its ``tmt_export.json`` says, and a note for the user
    (None, or one line: converted now, or kept in the user cache because the checkpoint's directory is read-only)."""

    path: Path
    notes: dict[str, Any]
    note: str | None = None


def cache_dir_beside(checkpoint: Path, *, weights: str | None) -> Path:
    """``<checkpoint>.ct2`` (``<checkpoint>.<weights>.ct2`` when ``--weights`` is given)."""
    return checkpoint.with_name(f"{checkpoint.name}{'' if weights is None else '.' + weights}.ct2")


def user_cache_dir(checkpoint: Path, *, weights: str | None) -> Path:
    """Where a checkpoint in a read-only directory keeps its cache: one directory per absolute path."""
    root = Path(os.environ.get("TMT_CACHE_DIR") or Path.home() / ".cache" / "tmt") / "ctranslate2"
    tag = hashlib.sha256(str(checkpoint.resolve()).encode("utf-8")).hexdigest()[:16]
    return root / cache_dir_beside(Path(f"{tag}-{checkpoint.name}"), weights=weights).name


def cached_model(checkpoint: str | os.PathLike, *, weights: str | None = None) -> CachedModel:
    """The CTranslate2 model of ``checkpoint`` (``weights``: ema, raw or None, as ``tmt translate --weights``):
    the cache beside it or in the user cache when one is fresh, else converted now into the first of them that
    can be written."""
    ct2 = require_ctranslate2()
    ckpt = Path(checkpoint)
    try:
        stat = ckpt.stat()
    except OSError:
        load_checkpoint(ckpt)  # names what is wrong with the path, as every command does
        raise
    if not ckpt.is_file():
        load_checkpoint(ckpt)
    versions = {
        "transformer_mt": __version__,
        "ctranslate2": ct2.__version__,
        "weights": weights or "default",
        "format": CACHE_FORMAT,
    }
    beside, elsewhere = cache_dir_beside(ckpt, weights=weights), user_cache_dir(ckpt, weights=weights)
    digest: list[str] = []  # the checkpoint's sha256, computed at most once
    for place in (beside, elsewhere):
        notes = _fresh_notes(place, ckpt, stat, versions, digest)
        if notes is not None:
            return CachedModel(place, notes)
    key = {
        **versions,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "sha256": digest[0] if digest else file_sha256(ckpt),
    }
    if _ours_or_free(beside):
        try:
            return _convert(
                ckpt,
                beside,
                key,
                weights=weights,
                note=f"converted {ckpt} for CTranslate2 into {beside} (reused while the checkpoint is unchanged)",
            )
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
        why = f"{beside.parent} is not writable"
    else:
        why = f"{beside} is not a conversion of --engine ctranslate2 as it wrote it (left as it is)"
    if not _ours_or_free(elsewhere):
        raise ExportError(
            f"{elsewhere}: not a conversion of --engine ctranslate2 as it wrote it, and {why}; move one of them away "
            "to cache the conversion there"
        )
    return _convert(
        ckpt,
        elsewhere,
        key,
        weights=weights,
        note=f"{why}: the CTranslate2 conversion of {ckpt.name} is cached in {elsewhere}",
    )


def _ours_or_free(place: Path) -> bool:
    """Whether a conversion may be written at ``place``: nothing is there, or a conversion this cache wrote whose
    files are all as it wrote them (never a directory of the user's, such as their own ``tmt export``)."""
    if not (place.exists() or place.is_symlink()):
        return True
    try:
        notes = json.loads((place / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(notes, dict) and isinstance(notes.get(CACHE_KEY), dict) and output_problem(place, force=True) is None
    )


def _fresh_notes(
    place: Path, ckpt: Path, stat: os.stat_result, versions: dict[str, str], digest: list[str]
) -> dict[str, Any] | None:
    """``place``'s tmt_export.json when it is a cache of this checkpoint's present content by these versions, else
    None."""
    try:
        notes = json.loads((place / EXPORT_MARKER).read_text(encoding="utf-8"))
        key = notes[CACHE_KEY]
        same_versions = all(key.get(k) == v for k, v in versions.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no cache there, or not one tmt wrote
        return None
    if not same_versions or key.get("size") != stat.st_size or not (place / "model.bin").is_file():
        return None
    if (key.get("mtime_ns"), key.get("ctime_ns")) == (stat.st_mtime_ns, stat.st_ctime_ns):
        return notes
    if not digest:
        digest.append(file_sha256(ckpt))
    if key.get("sha256") != digest[0]:
        return None
    key.update(
        mtime_ns=stat.st_mtime_ns, ctime_ns=stat.st_ctime_ns
    )  # the same content (copied, touched): check it by its times again
    try:
        _write_atomically(place / EXPORT_MARKER, json.dumps(notes, indent=2) + "\n")
    except OSError:  # a read-only cache stays usable; its content is hashed each time
        pass
    return notes


def _convert(ckpt: Path, out: Path, key: dict[str, Any], *, weights: str | None, note: str) -> CachedModel:
    """Convert into ``out`` (free, or a stale conversion of the cache's own: :func:`_ours_or_free`), then read back
    what it wrote."""
    export_ctranslate2(
        ckpt, out, force=True, weights=weights, notes={CACHE_KEY: key}, never_generated=True
    )  # tmt's search rule
    return CachedModel(out, json.loads((out / EXPORT_MARKER).read_text(encoding="utf-8")), note)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
