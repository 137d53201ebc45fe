"""Fixtures and helpers shared by the end-to-end tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bad_inputs(corpus_slice, spm_model, tmp_path_factory) -> dict[str, str]:
    from tests.conftest import make_checkpoint

    root = tmp_path_factory.mktemp("bad_inputs")
    bad = root / "bad.en"
    bad.write_bytes(b"Ein Hund.\n" + "Zwei Kätzchen.\n".encode("latin-1"))
    cfg = write(
        root / "c.yaml",
        f"data:\n  train_src: {corpus_slice['train.en']}\n  train_tgt: {corpus_slice['train.de']}\n"
        f"tokenizer:\n  model: {spm_model}\nmodel:\n  d_model: 16\n  heads: 2\n  d_ff: 16\n  encoder_layers: 1\n"
        f"  decoder_layers: 1\ntrain:\n  out_dir: {root / 'run'}\n  max_updates: 1\n  device: cpu\n",
    )  # tiny, should a row train
    os.mkfifo(root / "fifo")
    return {
        "ckpt": str(make_checkpoint(spm_model, root / "a.pt")),
        "ckpt2": str(make_checkpoint(spm_model, root / "b.pt", seed=1)),
        "spm": str(spm_model),
        "src": str(corpus_slice["val.en"]),
        "ref": str(corpus_slice["val.de"]),
        "long_ref": str(corpus_slice["train.de"]),
        "bad_utf8": str(bad),
        "cfg": str(cfg),
        "fifo": str(root / "fifo"),
        "dup_cfg": str(write(root / "dup.yaml", "train:\n  lr: 0.001\n  lr: 0.002\n")),
        "empty": str(write(root / "empty.txt", "")),
        "blank": str(write(root / "blank.txt", "\n \n\n")),
        "tmp": str(root / "scratch"),
    }
