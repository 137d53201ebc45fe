"""The encoded-corpus cache and a trained tokenizer are reused only for the same bytes: an edit in the middle of a
corpus that keeps its size and restores its mtime (`cp -p`, `touch -r`, `rsync -t`, tar) is seen."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import head
from transformer_mt.config import DataConfig, load_config
from transformer_mt.data import load_parallel, prepare_tokenizers
from transformer_mt.text import Tokenizer


def _edit_middle_keeping_size_and_mtime(path: Path, line: int) -> str:
    """Reverse one ASCII line in place (same bytes count), then put the old mtime back; returns the new line."""
    before = os.stat(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[line] = lines[line][::-1]
    path.write_text("\n".join(lines), encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    return lines[line]


def test_encoded_cache_sees_an_edit_in_the_middle_with_mtime_restored(multi30k, spm_model, tmp_path):
    tok = Tokenizer(spm_model)
    src, tgt = tmp_path / "big.en", tmp_path / "big.de"
    src.write_text("".join(line + "\n" for line in head(multi30k / "train.en", 4000)), encoding="utf-8")
    tgt.write_text("".join(line + "\n" for line in head(multi30k / "train.de", 4000)), encoding="utf-8")
    assert src.stat().st_size > 3 * (
        1 << 16
    )  # line 2000 on is in the middle, is outside the head and tail the key hashes
    mid = next(i for i in range(2000, 2400) if head(src, 1, skip=i)[0].isascii())
    cfg = DataConfig(max_len=250)
    first = load_parallel(src, tgt, tok, tok, cfg, cache_dir=tmp_path / "cache", filter_long=False, quiet=True)
    assert load_parallel(
        src, tgt, tok, tok, cfg, cache_dir=tmp_path / "cache", filter_long=False, quiet=True
    ).summary.from_cache
    new_line = _edit_middle_keeping_size_and_mtime(src, mid)
    again = load_parallel(src, tgt, tok, tok, cfg, cache_dir=tmp_path / "cache", filter_long=False, quiet=True)
    assert not again.summary.from_cache and again.directory != first.directory
    assert again.pair(mid)[0].tolist() == tok.encode([new_line])[0] != first.pair(mid)[0].tolist()


@pytest.mark.slow  # trains two small sentencepiece models
def test_tokenizer_is_retrained_after_an_edit_with_mtime_restored(corpus_slice, tmp_path):
    src, tgt = (Path(shutil.copy(corpus_slice[f"train.{side}"], tmp_path / f"t.{side}")) for side in ("en", "de"))
    cfg = load_config(
        None,
        [
            f"data.train_src={src}",
            f"data.train_tgt={tgt}",
            "tokenizer.vocab_size=300",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    logs: list[str] = []
    prepare_tokenizers(cfg, log=logs.append)
    prepare_tokenizers(cfg, log=logs.append)
    assert "reusing sentencepiece model" in logs[-1]
    model = tmp_path / "run" / "spm.model"
    _edit_middle_keeping_size_and_mtime(src, 1000)
    recipe_before = (tmp_path / "run" / "spm.json").read_bytes()
    prepare_tokenizers(cfg, log=logs.append)
    assert logs[-1].startswith("training sentencepiece") and model.is_file()
    assert (tmp_path / "run" / "spm.json").read_bytes() != recipe_before
