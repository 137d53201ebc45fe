"""Model directories written for other engines (`tmt export`, every format): never replace what an export did
not write, and never leave a half-written directory.

An export writes its files into a temporary directory beside the output and renames it into place
(:func:`staged_directory`), so a failed export leaves the output as it was. ``--force`` replaces only a
directory an earlier export wrote: one holding the marker file :data:`EXPORT_MARKER` and nothing but the files
that format writes (:func:`output_problem`); a run directory, or the current one, is never deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXPORT_MARKER = "tmt_export.json"  # every export writes it: where the model came from and how to decode it like tmt


def output_problem(out: Path, *, force: bool, files: frozenset[str]) -> str | None:
    """None when an export may write ``out``: it does not exist, or ``force`` is given and an earlier export wrote
    it (its marker, and nothing but ``files``, the names that format writes); else one line saying why not."""
    if not (out.exists() or out.is_symlink()):
        return None
    if not force:
        return f"{out}: already exists; choose another -o directory or pass --force to replace it"
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() and not out.is_symlink() else None
    ours = entries is not None and EXPORT_MARKER in entries and set(entries) <= files
    if ours:
        try:
            ours = str(json.loads((out / EXPORT_MARKER).read_text(encoding="utf-8")).get("exported_by", "")).startswith("transformer_mt")
        except (OSError, ValueError, AttributeError):
            ours = False
    if ours:
        return None
    held = "it is not a directory" if entries is None else f"it holds {', '.join(entries[:3]) or 'nothing'}" + (", ..." if len(entries) > 3 else "")
    return f"{out}: not a directory tmt export wrote ({held}); --force replaces only an earlier export: choose a new -o directory"


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to write the export into; renamed to ``out`` when the block ends
    without an error (an earlier export there, checked by :func:`output_problem`, is set aside first, then
    deleted), removed when it raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        yield staging
        _move_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, out: Path) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(staging, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
    os.rename(out, old / out.name)
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old / out.name, out)  # put the earlier export back
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)
