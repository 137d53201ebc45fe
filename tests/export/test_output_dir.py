"""What every `tmt export` format shares (transformer_mt.checkpoint.exports): the directory is written beside the
output and renamed into place, with the permissions any directory the user makes gets; its marker remembers the
sha256 of each file written, and ``--force`` replaces an earlier export only while every file in it is one the export
wrote, unchanged."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from transformer_mt.checkpoint import EXPORT_MARKER, output_problem, staged_directory, write_export_marker


def _export(out: Path, files: dict[str, bytes]) -> None:
    with staged_directory(out) as staging:
        for name, content in files.items():
            (staging / name).write_bytes(content)
        write_export_marker(staging, {"exported_by": "transformer_mt test", "checkpoint": "m.pt"})


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_the_directory_gets_the_permissions_of_any_directory_the_user_makes(umask, tmp_path):
    before = os.umask(umask)
    try:
        _export(tmp_path / "out", {"model.bin": b"weights"})
        (tmp_path / "mine").mkdir()
    finally:
        os.umask(before)
    assert (tmp_path / "out").stat().st_mode & 0o777 == (tmp_path / "mine").stat().st_mode & 0o777 == 0o777 & ~umask


def test_the_marker_holds_the_sha256_of_each_file_written(tmp_path):
    files = {"model.bin": b"weights", "config.json": b"{}", "vocabulary.txt": b"a\nb\n"}
    _export(tmp_path / "out", files)
    marker = json.loads((tmp_path / "out" / EXPORT_MARKER).read_text(encoding="utf-8"))
    assert marker["files"] == {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}


def test_force_replaces_an_export_only_while_its_files_are_unchanged(tmp_path):
    out = tmp_path / "out"
    _export(out, {"model.bin": b"weights", "config.json": b"{}"})
    assert output_problem(out, force=False) is not None and output_problem(out, force=True) is None
    (out / "config.json").write_bytes(b'{"fine-tuned": true}')  # what save_pretrained does to an exported directory
    problem = output_problem(out, force=True)
    assert problem is not None and str(out / "config.json") in problem and "changed" in problem and "\n" not in problem
    (out / "config.json").write_bytes(b"{}")
    (out / "model.bin").unlink()  # a file the user deleted: nothing of theirs to lose
    assert output_problem(out, force=True) is None
    (out / "notes.txt").write_text("mine")
    problem = output_problem(out, force=True)
    assert problem is not None and str(out / "notes.txt") in problem and "\n" not in problem
    (out / "notes.txt").unlink()
    (out / "extra").mkdir()
    assert output_problem(out, force=True) is not None
    (out / "extra").rmdir()
    marker = json.loads((out / EXPORT_MARKER).read_text(encoding="utf-8"))
    del marker["files"]  # an export that kept no hashes: what it holds cannot be told from what the user wrote
    (out / EXPORT_MARKER).write_text(json.dumps(marker), encoding="utf-8")
    problem = output_problem(out, force=True)
    assert problem is not None and str(out) in problem


def test_a_failed_first_rename_leaves_the_earlier_export_and_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _export(out, {"model.bin": b"old"})
    real = os.rename

    def rename(src, dst):  # moving the earlier export aside fails (a busy mount, a permission)
        if Path(src) == out:
            raise PermissionError(13, "Permission denied", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(PermissionError):
        _export(out, {"model.bin": b"new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "model.bin").read_bytes() == b"old"
