"""A multilingual run of tagged corpora, end to end: tmt trains its tokenizer with the tags as pieces, each source
starts with its tags, and validation reports each direction; each direction's result equals a separate evaluation of
that set (the loss computed here from the checkpoint, BLEU from `tmt evaluate --tgt-lang`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import head, run_cli
from tests.data.multicorpus import corpora_override, corpus_files, valid_override
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import load_config
from transformer_mt.data import collate
from transformer_mt.model import TeacherForcedLoss

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

RUN = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=4",
    "model.d_ff=64",
    "model.dropout=0.0",
    "tokenizer.vocab_size=400",
    "train.threads=1",
    "train.max_tokens=1500",
    "train.max_updates=120",
    "train.validate_every=60",
    "train.log_every=20",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.005",
    "train.warmup_updates=20",
    "train.valid_bleu_sentences=0",
    "train.device=cpu",
    "decode.max_len_b=20",
]


@dataclass(frozen=True)
class TaggedRun:
    out: Path
    files: dict


@pytest.fixture(scope="module")
def tagged_run(multi30k, tmp_path_factory) -> TaggedRun:
    """en-de, en-fr (weight 1) and a <BT>-tagged en-de corpus (weight 0.5), validated on en-de and en-fr; the
    tokenizer trained by tmt (tokenizer.model empty)."""
    from transformer_mt.training import train

    root = tmp_path_factory.mktemp("tagged_run")
    files = corpus_files(multi30k, root / "data", pairs=500, bt_pairs=200, valid=16)
    out = root / "run"
    result = train(load_config(None, [corpora_override(files), valid_override(files), f"train.out_dir={out}", *RUN]))
    assert result.progress.update == 120, result.stop_reason
    return TaggedRun(out, files)


def test_a_tagged_multilingual_run_trains_end_to_end(tagged_run) -> None:
    from transformer_mt.text import Tokenizer

    tok = Tokenizer(tagged_run.out / "spm.model")
    de, fr, bt = tok.tag_ids(["<2de>", "<2fr>", "<BT>"], where="test")  # one piece each
    caches = {p.name.split("-")[0]: p for p in (tagged_run.out / "cache").iterdir()}
    meta = json.loads((caches["bt.en"] / "meta.json").read_text())
    assert meta["key_inputs"]["src_prefix"] == [de, bt]
    state = load_checkpoint(tagged_run.out / "checkpoint_last.pt")
    seen = state["progress"]["corpus_tokens"]
    assert set(seen) == {"en-de", "en-fr", "bt"} and sum(seen.values()) == state["progress"]["tokens"]
    assert state["progress"]["batching"].endswith("corpora=en-de*1.0,en-fr*1.0,bt*0.5 temperature=0.0")
    records = [json.loads(line) for line in (tagged_run.out / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert train_records[-1]["loss"] < train_records[0]["loss"] - 1.0  # it learnt
    # the bt corpus is half of en-de's size at half its weight: a tenth of the epoch's pairs, about
    assert 0.05 < train_records[-1]["share/bt"] < 0.2
    log = (tagged_run.out / "train.log").read_text()
    assert "training sentencepiece" in log and "with the tags <2de> <2fr> <BT>" in log
    assert "  bt: 200 pairs" in log and "weight 0.5, 100 pairs per epoch" in log
    assert "validation at update 120, en-fr: loss" in log


def _loss_of(model, tok, src: Path, tgt: Path, prefix: list[int], label_smoothing: float) -> float:
    """The label-smoothed loss per target token of all pairs of src / tgt in one batch, the sources starting with
    `prefix`: computed here from the model, not by the validation code."""
    pairs = [(s, t) for s, t in zip(head(src, 100), head(tgt, 100)) if s.strip() and t.strip()]
    sources = [prefix + ids for ids in tok.encode([s.strip() for s, _ in pairs])]
    targets = tok.encode([t.strip() for _, t in pairs])
    batch = collate(list(zip(sources, targets)))
    with torch.inference_mode():
        loss, _, n = TeacherForcedLoss(model, label_smoothing=label_smoothing)(batch.src, batch.tgt_in, batch.tgt_out)
    return float(loss) / int(n)


def test_each_directions_validation_equals_a_separate_evaluation(tagged_run, capsys) -> None:
    import transformer_mt

    checkpoint = tagged_run.out / "checkpoint_last.pt"
    metrics = load_checkpoint(checkpoint)["metrics"]  # the validation of the weights it holds (update 120)
    translator = transformer_mt.load(checkpoint, device="cpu")
    files, tok = tagged_run.files, translator.src_tok
    bleus = []
    for lang in ("de", "fr"):
        name = f"en-{lang}"
        (prefix,) = tok.tag_ids([f"<2{lang}>"], where="test")
        loss = _loss_of(translator.model, tok, files["val.en"], files[f"val.{lang}"], [prefix], 0.1)
        assert math.isclose(metrics[f"valid/{name}/loss"], loss, rel_tol=1e-5), (name, loss)
        hyp = tagged_run.out / f"val.{lang}.hyp"
        argv = ["evaluate", "-c", checkpoint, "--src", files["val.en"], "--ref", files[f"val.{lang}"]]
        code, out, err = run_cli([*argv, "--tgt-lang", lang, "--beam", "1", "-o", hyp, "--json"], capsys)
        assert code == 0, err
        assert round(metrics[f"valid/{name}/bleu"], 2) == json.loads(out)["bleu"], name
        bleus.append(metrics[f"valid/{name}/bleu"])
    assert any(b > 0 for b in bleus), bleus  # equal and not both zero: the comparison says something
    assert math.isclose(metrics["val_bleu"], sum(bleus) / 2)
    assert math.isclose(metrics["val_loss"], (metrics["valid/en-de/loss"] + metrics["valid/en-fr/loss"]) / 2)
    assert math.isclose(metrics["val_ppl"], math.exp(metrics["val_nll"]))
