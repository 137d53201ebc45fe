"""Shared fixtures: the real Multi30k corpus from ../shared and a small sentencepiece model on a slice of it."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("TMT_MULTI30K", REPO.parent / "shared" / "data" / "multi30k"))


def head(path: Path, n: int, *, skip: int = 0) -> list[str]:
    """Lines skip..skip+n of a corpus file, newline stripped."""
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, skip, skip + n)]


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K}; set TMT_MULTI30K")
    return MULTI30K


@pytest.fixture(scope="session")
def corpus_slice(multi30k, tmp_path_factory) -> dict[str, Path]:
    """The first 2000 training pairs and 100 validation pairs of Multi30k en-de, as files."""
    root = tmp_path_factory.mktemp("m30k")
    out = {}
    for split, n in (("train", 2000), ("val", 100)):
        for lang in ("en", "de"):
            path = root / f"{split}.{lang}"
            path.write_text("\n".join(head(multi30k / f"{split}.{lang}", n)) + "\n", encoding="utf-8")
            out[f"{split}.{lang}"] = path
    return out


@pytest.fixture(scope="session")
def spm_model(corpus_slice, tmp_path_factory) -> Path:
    """A joint 1000-piece unigram model trained on the 2000-pair slice."""
    from transformer_mt.tokenizer import train_sentencepiece

    prefix = tmp_path_factory.mktemp("spm") / "joint"
    return train_sentencepiece([corpus_slice["train.en"], corpus_slice["train.de"]], prefix, vocab_size=1000)
