"""Shared fixtures: the real Multi30k corpus from ../shared and a small sentencepiece model on a slice of it."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
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


# ---------------------------------------------------------------- one tiny trained model, shared
# Trained once per session through the real `train()`, for the tests that need a model which has
# learned something (attention maps, export parity, the server): about 5 s each on one CPU thread.
# After 150 updates it writes varied German ("Ein Mann mit einem ..."), not one repeated token.
TINY_RUN = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.heads=4", "model.d_ff=64",
            "model.dropout=0.0", "train.lr_schedule=inverse_sqrt", "train.lr=0.005", "train.warmup_updates=20",
            "train.max_tokens=2000", "train.max_updates=150", "train.validate_every=75", "train.valid_bleu_sentences=8",
            "train.log_every=25", "train.keep_last=2", "train.threads=1", "train.seed=7", "decode.beam=2"]
TRAINED_FIXTURES = {"tiny_run", "tiny_run_postnorm", "tiny_checkpoint", "tiny_checkpoint_postnorm"}


@dataclass(frozen=True)
class TrainedRun:
    """A finished tiny `tmt train` run. Its files are shared by the whole session: read, never write."""

    run_dir: Path  # train.log, metrics.jsonl, config.yaml, checkpoint_{last,best,75,150}.pt
    checkpoint: Path  # run_dir / "checkpoint_last.pt" (update 150)
    spm_model: Path  # the joint tokenizer (also packed inside the checkpoint)
    corpus: dict[str, Path]  # the corpus_slice files it trained ("train.en/de") and validated ("val.en/de") on


def _train_tiny(corpus_slice: dict[str, Path], spm_model: Path, out_dir: Path, *extra: str) -> TrainedRun:
    from transformer_mt.config import load_config
    from transformer_mt.train import train

    cfg = load_config(None, [
        f"data.train_src={corpus_slice['train.en']}", f"data.train_tgt={corpus_slice['train.de']}",
        f"data.valid_src={corpus_slice['val.en']}", f"data.valid_tgt={corpus_slice['val.de']}",
        f"tokenizer.model={spm_model}", f"train.out_dir={out_dir}", *TINY_RUN, *extra,
    ])
    result = train(cfg)
    assert result.progress.update == cfg.train.max_updates, result.stop_reason
    return TrainedRun(run_dir=out_dir, checkpoint=out_dir / "checkpoint_last.pt", spm_model=spm_model, corpus=corpus_slice)


@pytest.fixture(scope="session")
def tiny_run(corpus_slice, spm_model, tmp_path_factory) -> TrainedRun:
    """Pre-norm, 2+2 layers, d_model 32, 4 heads, shared 1000-piece vocabulary: 150 updates on the
    2000-pair slice, validated at updates 75 and 150 (loss on 100 pairs, greedy BLEU on 8)."""
    return _train_tiny(corpus_slice, spm_model, tmp_path_factory.mktemp("tiny_run") / "run", "model.norm=pre")


@pytest.fixture(scope="session")
def tiny_run_postnorm(corpus_slice, spm_model, tmp_path_factory) -> TrainedRun:
    """As `tiny_run`, with post-norm layers (the paper's)."""
    return _train_tiny(corpus_slice, spm_model, tmp_path_factory.mktemp("tiny_run_post") / "run", "model.norm=post")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_run) -> Path:
    """checkpoint_last.pt of `tiny_run` (pre-norm)."""
    return tiny_run.checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint_postnorm(tiny_run_postnorm) -> Path:
    """checkpoint_last.pt of `tiny_run_postnorm` (post-norm)."""
    return tiny_run_postnorm.checkpoint


def pytest_collection_modifyitems(items) -> None:
    """A test that needs a trained model is slow (it trains one, the first time): mark it so."""
    for item in items:
        if TRAINED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
