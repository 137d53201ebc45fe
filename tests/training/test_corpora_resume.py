"""A run of several corpora resumed mid-epoch continues with exactly the uninterrupted run's batches: the epoch's
pairs and batches are a pure function of (seed, epoch), and the checkpoint's batching record names the corpora and
their weights, so that a resume after changing them starts the epoch again instead of reading another list."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import head
from tests.data.multicorpus import corpus_files
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import Config, load_config
from transformer_mt.data import MixedCorpus, load_datasets
from transformer_mt.text import Tokenizer
from transformer_mt.training import resumed_config, train
from transformer_mt.training.corpora import batching_of, check_batching
from transformer_mt.training.state import Batching, Progress
from transformer_mt.training.step import update_schedule


@pytest.fixture(scope="module")
def files(multi30k, tmp_path_factory) -> dict:
    return corpus_files(multi30k, tmp_path_factory.mktemp("resume_corpora"), pairs=300, bt_pairs=120, valid=8)


def _config(files: dict, spm_model: Path, out: Path, *extra: str, fr_weight: float = 0.5) -> Config:
    """Three corpora without target languages (so no tags: the session tokenizer serves): weights 1, fr_weight, 1.5."""
    corpora = (
        f"data.corpora=[{{name: de, src: {files['train.en']}, tgt: {files['train.de']}}}, "
        f"{{name: fr, src: {files['train.en']}, tgt: {files['train.fr']}, weight: {fr_weight}}}, "
        f"{{name: bt, src: {files['bt.en']}, tgt: {files['bt.de']}, weight: 1.5}}]"
    )
    return load_config(None, [corpora, f"tokenizer.model={spm_model}", f"train.out_dir={out}", *extra])


def _mix(cfg: Config, tok: Tokenizer) -> MixedCorpus:
    """The run's training data as a fresh process builds it (load_datasets, then the mix)."""
    sets = load_datasets(cfg, tok, tok, quiet=True)
    return MixedCorpus(
        [s.data for s in sets.train],
        names=[s.name for s in sets.train],
        weights=[s.config.weight for s in sets.train],
        temperature=cfg.data.sampling_temperature,
    )


@pytest.mark.parametrize("temperature", [0.0, 5.0])
def test_a_resumed_epoch_continues_with_the_uninterrupted_batches(files, spm_model, tmp_path, temperature) -> None:
    cfg = _config(
        files,
        spm_model,
        tmp_path,
        "train.max_tokens=700",
        "train.update_freq=2",
        "train.max_epochs=3",
        "train.seed=11",
        f"data.sampling_temperature={temperature}",
    )
    tok = Tokenizer(spm_model)
    straight = [[b.tolist() for b in u.batches] for u in update_schedule(_mix(cfg, tok), cfg.train, world_size=2)]
    assert len(straight) > 12
    for stop in (3, len(straight) // 2, len(straight) - 2):  # early, mid-run (mid-epoch), near the end
        # where an interrupted run's progress points after `stop` updates, as the trainer records it
        p = Progress()
        for u in list(update_schedule(_mix(cfg, tok), cfg.train, world_size=2))[:stop]:
            p.epoch, p.batch_in_epoch = u.epoch, u.start + len(u.batches)
            if u.last:
                p.epoch, p.batch_in_epoch = u.epoch + 1, 0
        resumed = update_schedule(_mix(cfg, tok), cfg.train, world_size=2, epoch=p.epoch, start=p.batch_in_epoch)
        assert [[b.tolist() for b in u.batches] for u in resumed] == straight[stop:], stop


def test_the_batching_record_names_the_corpora_and_their_weights(files, spm_model, tmp_path) -> None:
    tok = Tokenizer(spm_model)
    cfg = _config(files, spm_model, tmp_path)
    now = batching_of(cfg, _mix(cfg, tok))
    assert "corpora=de*1.0,fr*0.5,bt*1.5 temperature=0.0" in now.to_text()
    assert Batching.parse(now.to_text()) == now
    logs: list[str] = []
    progress = Progress(epoch=2, batch_in_epoch=7, batching=now)
    check_batching(progress, now, log=logs.append)
    assert progress.batch_in_epoch == 7 and not logs  # unchanged: the position holds
    heavier = _config(files, spm_model, tmp_path, fr_weight=2.0)
    check_batching(progress, batching_of(heavier, _mix(heavier, tok)), log=logs.append)
    assert progress.batch_in_epoch == 0 and "corpora de*1.0,fr*0.5,bt*1.5 -> de*1.0,fr*2.0,bt*1.5" in logs[0]


def test_the_one_corpus_shorthand_keeps_its_batching_text() -> None:
    record = Batching.of(data="a.en-a.de-0123", max_tokens=4096, seed=1, subword_alpha=0.0, subword_nbest=-1)
    assert record.to_text() == "data=a.en-a.de-0123 max_tokens=4096 seed=1 subword=0/-1"
    assert Batching.parse(record.to_text()) == record


@pytest.mark.slow  # trains 8 + 4 + 4 updates of a 1+1-layer model (a few seconds)
@pytest.mark.usefixtures("one_thread")
def test_a_multi_corpus_run_resumed_mid_epoch_equals_the_uninterrupted_run(files, spm_model, tmp_path) -> None:
    tiny = [
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=16",
        "model.heads=2",
        "model.d_ff=32",
        "model.dropout=0.1",
        "train.threads=1",
        "train.max_tokens=500",
        "train.log_every=1",
        "train.validate_every=1000",
        "train.lr_schedule=inverse_sqrt",
        "train.warmup_updates=4",
        "train.lr=0.002",
        "train.device=cpu",
    ]
    train(_config(files, spm_model, tmp_path / "a", *tiny, "train.max_updates=8"))
    first = train(_config(files, spm_model, tmp_path / "b", *tiny, "train.max_updates=4"))
    assert first.progress.epoch == 1 and first.progress.batch_in_epoch == 4  # stopped mid-epoch
    train(resumed_config(tmp_path / "b", ["train.max_updates=8"]), resume=True)
    a, b = (load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("a", "b"))
    assert a["progress"]["corpus_tokens"] == b["progress"]["corpus_tokens"]
    assert set(a["progress"]["corpus_tokens"]) == {"de", "fr", "bt"}
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key

    def records(run: str) -> list[tuple]:
        import json

        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        train_records = [json.loads(line) for line in lines if '"kind": "train"' in line]
        return [(r["update"], r["loss"], r["share/de"], r["share/fr"], r["share/bt"]) for r in train_records]

    assert records("a") == records("b") and len(records("a")) == 8
    log = (tmp_path / "b" / "train.log").read_text()
    assert "corpora at update 8: " in log and "resuming: the batching changed" not in log
    assert head(tmp_path / "a" / "train.log", 1)[0].endswith("(each corpus taken weight times)")
