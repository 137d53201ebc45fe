"""Model directories written for other engines (`tmt export`, every format): never replace what an export did
not write, or what the user changed in it since, and never leave a half-written directory.

An export writes its files into a temporary directory beside the output and renames it into place
(:func:`staged_directory`), so a failed export leaves the output as it was; the directory gets the permissions of any
directory the user makes (their umask). Its marker file :data:`EXPORT_MARKER` (:func:`write_export_marker`) records
the sha256 of every file it wrote. ``--force`` replaces only a directory an earlier export wrote while every file in
it is one that export wrote, unchanged (:func:`output_problem`): fine-tuned weights saved into it, or any file of the
user's, stop it with one line naming the file; a run directory, or the current one, is never deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXPORT_MARKER = (
    "tmt_export.json"  # every export writes it: where the model came from, how to decode it like tmt, what it wrote
)
FILES_KEY = "files"  # the marker's {file name: sha256} of every other file the export wrote


def write_export_marker(directory: Path, notes: dict[str, Any]) -> None:
    """Write ``directory``'s :data:`EXPORT_MARKER`: ``notes`` and the sha256 of every file in it (the export's, all
    written by now)."""
    files = {
        path.name: file_sha256(path)
        for path in sorted(directory.iterdir())
        if path.name != EXPORT_MARKER and path.is_file()
    }
    (directory / EXPORT_MARKER).write_text(
        json.dumps({**notes, FILES_KEY: files}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def output_problem(out: Path, *, force: bool) -> str | None:
    """None when an export may write ``out``: it does not exist, or ``force`` is given and an earlier export wrote it
    and every file in it is one that export wrote, unchanged; else one line saying why not and what to do."""
    if not (out.exists() or out.is_symlink()):
        return None
    if not force:
        return f"{out}: already exists; choose another -o directory or pass --force to replace it"
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() and not out.is_symlink() else None
    written = _written_files(out) if entries is not None else None
    if written is None:
        held = (
            "it is not a directory"
            if entries is None
            else f"it holds {', '.join(entries[:3]) or 'nothing'}" + (", ..." if len(entries) > 3 else "")
        )
        return (
            f"{out}: not a directory tmt export wrote ({held}); --force replaces only an earlier export: choose a new "
            "-o directory"
        )
    if not written:
        return (
            f"{out}: its {EXPORT_MARKER} lists no files (an older tmt's export), so --force cannot tell them from "
            f"yours; delete {out} yourself or choose a new -o directory"
        )
    for name in entries or ():
        path = out / name
        if name == EXPORT_MARKER:
            continue
        if name not in written:
            return (
                f"{path}: not written by tmt export, and --force replaces only an export's own files; move it out of "
                f"{out} or choose a new -o directory"
            )
        if path.is_symlink() or not path.is_file() or file_sha256(path) != written[name]:
            return (
                f"{path}: changed since tmt export wrote it, and --force replaces only unchanged files; move it out of "
                f"{out} or choose a new -o directory"
            )
    return None


def _written_files(out: Path) -> dict[str, str] | None:
    """What ``out``'s marker says the export wrote ({name: sha256}; {} for a marker without the list), or None when
    ``out`` has no marker that tmt export wrote."""
    try:
        notes = json.loads((out / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(notes, dict) or not str(notes.get("exported_by", "")).startswith("transformer_mt"):
        return None
    files = notes.get(FILES_KEY, {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    return files


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to write the export into; renamed to ``out`` when the block ends
    without an error (an earlier export there, checked by :func:`output_problem`, is set aside first, then
    deleted), removed when it raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_directory_beside(out, ".tmp")
    try:
        yield staging
        _move_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _new_directory_beside(out: Path, suffix: str) -> Path:
    """An empty directory ``.<out name>.<random><suffix>`` beside ``out``, made as any directory the user makes
    (mode 0777 less the umask; ``tempfile.mkdtemp``'s 0700 would stay on the renamed export)."""
    for _ in range(100):
        path = out.parent / f".{out.name}.{secrets.token_hex(4)}{suffix}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{out.parent}: no free temporary name beside {out.name}")


def _move_into_place(staging: Path, out: Path) -> None:
    if not (out.exists() or out.is_symlink()):
        os.rename(staging, out)
        return
    old = _new_directory_beside(out, ".old")
    try:
        os.rename(out, old / out.name)
    except BaseException:
        old.rmdir()
        raise
    try:
        os.rename(staging, out)
    except BaseException:
        os.rename(old / out.name, out)  # put the earlier export back
        old.rmdir()
        raise
    shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
