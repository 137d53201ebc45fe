"""Training: it learns, it resumes exactly, it never loses a checkpoint, and bad data gets one clear line."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from typing import cast

import pytest
import torch

from tests.conftest import head, run_cli, run_config
from transformer_mt.checkpoint import CheckpointError, load_checkpoint
from transformer_mt.config import load_config
from transformer_mt.decoding import translate_ids
from transformer_mt.text import Tokenizer
from transformer_mt.training import RunDirError, train

TINY = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=64", "model.heads=4", "model.d_ff=128"]


def tiny_config(files, spm_model, out_dir, *extra):
    return run_config(files, spm_model, out_dir, "train.threads=1", *TINY, *extra)


@pytest.mark.slow
def test_tiny_model_overfits_64_real_pairs(pairs64, spm_model, tmp_path):
    cfg = tiny_config(
        pairs64,
        spm_model,
        tmp_path / "run",
        "model.dropout=0.0",
        "train.label_smoothing=0.0",
        "train.lr_schedule=inverse_sqrt",
        "train.lr=0.003",
        "train.warmup_updates=30",
        "train.max_updates=400",
        "train.max_tokens=4096",
        "train.validate_every=400",
        "train.valid_bleu_sentences=4",
        "train.log_every=50",
    )
    losses = []
    result = train(cfg, on_update=lambda update, s: losses.append(float(s.loss) / s.tokens))
    assert result.progress.update == 400
    assert losses[0] > 5.0, "an untrained model starts near log(vocab)"
    assert sum(losses[-10:]) / 10 < 0.15, f"training loss should fall near 0, got {losses[-10:]}"
    # greedy decoding reproduces most training targets exactly
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    from transformer_mt.model import Transformer

    tok = Tokenizer(spm_model)
    model = Transformer(cfg.model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    model.load_state_dict(state["model"])
    src = head(pairs64["train.en"], 64)
    tgt = head(pairs64["train.de"], 64)
    hyps = translate_ids(model, tok.encode(src), beam=1, batch_tokens=2000)
    out = tok.decode([h[0].tokens for h in hyps])
    exact = sum(o == " ".join(t.split()) for o, t in zip(out, tgt))
    assert exact >= 48, f"only {exact}/64 training targets reproduced"
    # the metrics file has a line per log interval and per validation
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if "loss" in r] == list(range(50, 401, 50))
    assert any("val_bleu" in r for r in records)
    assert (tmp_path / "run" / "config.yaml").is_file() and (tmp_path / "run" / "checkpoint_best.pt").is_file()


TRAIN_FIELDS = {
    "kind",
    "update",
    "epoch",
    "wall",
    "loss",
    "nll",
    "ppl",
    "lr",
    "gnorm",
    "tokens",
    "tokens_per_s",
    "updates_per_s",
}
VALID_FIELDS = {
    "kind",
    "update",
    "epoch",
    "wall",
    "val_loss",
    "val_nll",
    "val_ppl",
    "val_bleu",
    "best",
    "valid_seconds",
}
SUMMARY_FIELDS = {
    "kind",
    "update",
    "epoch",
    "wall",
    "stop_reason",
    "target_tokens",
    "last_valid",
    "train_flops",
    "flops_per_token",
    "update_seconds",
    "achieved_tflops",
    "peak_tflops",
    "peak_source",
    "mfu",
    "mfu_wall",
}


@pytest.mark.slow
def test_metrics_jsonl_follows_the_documented_schema(pairs64, spm_model, tmp_path):
    out = tmp_path / "run"
    result = train(
        tiny_config(
            pairs64,
            spm_model,
            out,
            "train.max_tokens=300",
            "train.max_epochs=2",
            "train.log_every=1",
            "train.validate_every=4",
            "train.valid_bleu_sentences=4",
            "train.best_metric=loss",
        )
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    n = result.progress.update
    by_kind = {kind: [r for r in records if r["kind"] == kind] for kind in ("train", "valid", "summary")}
    assert (
        sum(map(len, by_kind.values())) == len(records)
        and records[-1]["kind"] == "summary"
        and len(by_kind["summary"]) == 1
    )
    assert all(set(r) == TRAIN_FIELDS for r in by_kind["train"]) and [r["update"] for r in by_kind["train"]] == list(
        range(1, n + 1)
    )
    assert all(set(r) == VALID_FIELDS for r in by_kind["valid"])
    assert [r["update"] for r in by_kind["valid"]] == list(range(4, n + 1, 4)) + (
        [n] if n % 4 else []
    )  # and once at the end
    # "best": the validation loss improved on every earlier one
    losses = [r["val_loss"] for r in by_kind["valid"]]
    assert [r["best"] for r in by_kind["valid"]] == [all(x < y for y in losses[:i]) for i, x in enumerate(losses)]
    walls = [r["wall"] for r in records]
    assert walls == sorted(walls) and walls[0] >= 0
    # the summary: two epochs of the 64 pairs, each target counted as its pieces + EOS (from the tokenizer, not the
    # trainer)
    summary = by_kind["summary"][0]
    tok = Tokenizer(spm_model)
    per_epoch = sum(len(ids) + 1 for ids in tok.encode(head(pairs64["train.de"], 64)))
    assert set(summary) == SUMMARY_FIELDS
    assert (summary["update"], summary["epoch"], summary["stop_reason"]) == (n, 3, "max_epochs=2 reached")
    assert summary["target_tokens"] == 2 * per_epoch == sum(r["tokens"] for r in by_kind["train"])
    assert summary["last_valid"] == {k: v for k, v in by_kind["valid"][-1].items() if k.startswith("val_")}
    epochs = [r["epoch"] for r in by_kind["train"]]
    assert epochs == sorted(epochs) and set(epochs) == {1, 2}


@pytest.mark.slow
def test_shared_tiny_runs_are_as_documented(tiny_run, tiny_run_postnorm):
    """The session fixtures other tests build on: 150 updates, pre- and post-norm, translating more than one word."""
    from transformer_mt.checkpoint import config_from_checkpoint
    from transformer_mt.model import Transformer

    for run, norm in ((tiny_run, "pre"), (tiny_run_postnorm, "post")):
        state = load_checkpoint(run.checkpoint)
        assert state["config"]["model"]["norm"] == norm and state["progress"]["update"] == 150
        assert {"checkpoint_best.pt", "checkpoint_75.pt", "checkpoint_150.pt", "train.log", "config.yaml"} <= {
            p.name for p in run.run_dir.iterdir()
        }
        records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in records if r["kind"] == "valid"] == [75, 150] and records[-1]["kind"] == "summary"
        assert records[-1]["last_valid"]["val_loss"] < 5.5  # log(1000 pieces) = 6.9 at the start
        tok = Tokenizer(run.spm_model)
        model = Transformer(
            config_from_checkpoint(state).model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size
        )
        model.load_state_dict(state["model"])
        out = tok.decode([h[0].tokens for h in translate_ids(model, tok.encode(head(run.corpus["val.en"], 8)), beam=1)])
        assert len({w for line in out for w in line.split()}) >= 5, out  # not one word repeated


@pytest.mark.slow
@pytest.mark.parametrize("subword_alpha", [0.0, 0.3])
def test_resume_gives_the_same_parameters_and_losses(pairs64, spm_model, tmp_path, subword_alpha):
    common = [
        "train.max_tokens=300",
        "train.update_freq=2",
        "train.validate_every=5",
        "train.valid_bleu_sentences=3",
        "train.lr_schedule=inverse_sqrt",
        "train.lr=0.002",
        "train.warmup_updates=5",
        "model.dropout=0.1",
        f"data.subword_alpha={subword_alpha}",
    ]  # with sampling, the resumed run re-samples the same pieces
    straight, first, second = [], [], []
    train(
        tiny_config(pairs64, spm_model, tmp_path / "a", *common, "train.max_updates=20"),
        on_update=lambda u, s: straight.append(float(s.loss)),
    )
    res = train(
        tiny_config(pairs64, spm_model, tmp_path / "b", *common, "train.max_updates=10"),
        on_update=lambda u, s: first.append(float(s.loss)),
    )
    assert res.progress.update == 10 and res.progress.epoch >= 1
    from transformer_mt.training import resumed_config

    cfg = resumed_config(tmp_path / "b", ["train.max_updates=20"])
    train(cfg, resume=True, on_update=lambda u, s: second.append(float(s.loss)))
    assert len(straight) == 20 and len(first) + len(second) == 20
    assert first + second == pytest.approx(straight, rel=1e-6, abs=1e-6)
    a = load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)
    # 64 pairs in 300-token batches span several epochs: the resumed run crossed an epoch boundary too
    assert load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["progress"]["epoch"] > 1


@pytest.mark.slow
def test_numbered_checkpoints_follow_save_every_between_validations(pairs64, spm_model, tmp_path):
    out = tmp_path / "run"
    train(
        tiny_config(
            pairs64,
            spm_model,
            out,
            "train.max_tokens=300",
            "train.validate_every=4",
            "train.save_every=3",
            "train.keep_last=3",
            "train.valid_bleu_sentences=-1",
            "train.max_updates=12",
        )
    )
    numbered = sorted(int(p.stem.split("_")[1]) for p in out.glob("checkpoint_[0-9]*.pt"))
    assert numbered == [6, 9, 12]  # 3, 6, 9, 12 saved (not 4 or 8, the validations), the newest 3 kept
    for update in numbered:
        assert load_checkpoint(out / f"checkpoint_{update}.pt")["progress"]["update"] == update


@pytest.mark.slow
def test_failed_save_keeps_the_last_good_checkpoint(pairs64, spm_model, tmp_path, monkeypatch):
    cfg = tiny_config(
        pairs64,
        spm_model,
        tmp_path / "run",
        "train.max_updates=12",
        "train.validate_every=4",
        "train.valid_bleu_sentences=-1",
        "train.max_tokens=300",
    )
    real_save = torch.save
    calls = {"n": 0}

    def flaky_save(obj, f, *args, **kwargs):
        calls["n"] += 1
        # the save of update 4 succeeds (one serialisation named best, numbered and last); the disk fills at update 8
        if calls["n"] > 1:
            f.write(b"partial bytes")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", flaky_save)
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoint is intact"):
        train(cfg)
    monkeypatch.setattr(torch, "save", real_save)
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert state["progress"]["update"] == 4
    assert not [
        p for p in (tmp_path / "run").iterdir() if (p.name.startswith(".") and p.name != ".lock") or p.suffix == ".tmp"
    ]


@pytest.mark.slow
def test_sigint_saves_a_resumable_checkpoint(pairs64, spm_model, tmp_path):
    run = tmp_path / "run"
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "data": {"train_src": str(pairs64["train.en"]), "train_tgt": str(pairs64["train.de"])},
                "tokenizer": {"model": str(spm_model)},
                "model": {"encoder_layers": 1, "decoder_layers": 1, "d_model": 32, "heads": 2, "d_ff": 64},
                "train": {
                    "out_dir": str(run),
                    "max_updates": 100000,
                    "log_every": 1,
                    "max_tokens": 300,
                    "threads": 1,
                    "device": "cpu",
                },
            }
        )
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt.cli", "train", "-c", str(cfg_path)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 180  # a bound on the wait only: a loaded machine starts the run slowly
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "continue with `tmt train --resume" in err
    state = load_checkpoint(run / "checkpoint_last.pt")
    done = state["progress"]["update"]
    assert done >= 3
    cfg = load_config(None, [f"train.out_dir={run}"], check_files=False)
    from transformer_mt.training import resumed_config

    cfg = resumed_config(run, [f"train.max_updates={done + 2}"])
    result = train(cfg, resume=True)
    assert result.progress.update == done + 2


def write_cfg(tmp_path, src, tgt, spm_model, **train):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        json.dumps(
            {
                "data": {"train_src": str(src), "train_tgt": str(tgt), "max_len": 30},
                "tokenizer": {"model": str(spm_model)},
                "model": {
                    "encoder_layers": 1,
                    "decoder_layers": 1,
                    "d_model": 32,
                    "heads": 2,
                    "d_ff": 64,
                    "max_positions": 64,
                },
                "train": {"out_dir": str(tmp_path / "run"), "max_updates": 3, "threads": 1, "device": "cpu", **train},
            }
        )
    )
    return path


def test_mismatched_line_counts_is_one_line(tmp_path, spm_model, capsys):
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    code, _, err = run_cli(
        ["train", "-c", str(write_cfg(tmp_path, tmp_path / "a.en", tmp_path / "a.de", spm_model))], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "a.en" in err and "a.de" in err and "3" in err and "2" in err


def test_invalid_utf8_names_file_and_line(tmp_path, spm_model, capsys):
    (tmp_path / "a.en").write_bytes(b"one\ntwo\nth\xffree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    code, _, err = run_cli(
        ["train", "-c", str(write_cfg(tmp_path, tmp_path / "a.en", tmp_path / "a.de", spm_model))], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "a.en" in err and ":3" in err and "UTF-8" in err


@pytest.mark.slow
def test_existing_run_is_not_overwritten(pairs64, spm_model, tmp_path):
    cfg = tiny_config(pairs64, spm_model, tmp_path / "run", "train.max_updates=1", "train.valid_bleu_sentences=-1")
    train(cfg)
    with pytest.raises(RunDirError, match="already holds a run.*--resume"):
        train(cfg)


@pytest.mark.slow
def test_empty_lines_and_long_pairs_are_dropped_and_counted(tmp_path, pairs64, spm_model, capsys):
    src = head(pairs64["train.en"], 20)
    tgt = head(pairs64["train.de"], 20)
    src[3], tgt[7] = "", "   "  # two empty pairs (one per side)
    src[10] = " ".join(["a man walks"] * 20)  # 60 words: over max_len=30 pieces
    tgt[12] = " ".join(["Hund"] * 40)
    (tmp_path / "e.en").write_text("\n".join(src) + "\n")
    (tmp_path / "e.de").write_text("\n".join(tgt) + "\n")
    code, _, err = run_cli(
        ["train", "-c", str(write_cfg(tmp_path, tmp_path / "e.en", tmp_path / "e.de", spm_model))], capsys
    )
    assert code in (0, None), err
    log = (tmp_path / "run" / "train.log").read_text()
    assert "20 pairs read, 16 kept" in log
    assert "2 empty" in log and "2 over 30 pieces" in log


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_gradients_reach_adam_clipped_only_when_clip_norm_is_set(corpus_slice, spm_model, tmp_path, clip):
    """The norm Adam sees: with train.clip_norm the total norm is rescaled to it (torch's rule, computed here
    from the gradients themselves); without, the gradients are untouched."""
    from transformer_mt.training import Trainer, set_up

    cfg = tiny_config(
        corpus_slice,
        spm_model,
        tmp_path / "run",
        f"train.clip_norm={clip}",
        "train.max_updates=3",
        "train.validate_every=100",
        "train.valid_bleu_sentences=-1",
    )
    trainer = Trainer(set_up(cfg, resume=False))
    seen, step = [], trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        seen.append(float(torch.sqrt(cast(torch.Tensor, sum((g.double() ** 2).sum() for g in grads)))))
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    norms = []
    trainer.on_update = lambda update, stats: norms.append(stats.gnorm)
    trainer.run()
    assert len(seen) == 3
    for before, after in zip(norms, seen):
        assert before > 0.05, "the test needs raw norms above the clip value"
        assert after == pytest.approx(min(before, clip) if clip else before, rel=1e-4)


def test_marian_options_train_and_resume(pairs64, spm_model, tmp_path):
    """swish, the halves position layout and an output bias (with restrict_output): a few updates, then a resume
    that gives the losses and parameters of the uninterrupted run; the bias is learned and checkpointed."""
    common = [
        "model.activation=swish",
        "model.position_layout=halves",
        "model.output_bias=true",
        "model.restrict_output=true",
        "train.max_tokens=300",
        "train.validate_every=3",
        "train.valid_bleu_sentences=-1",
        "train.lr_schedule=inverse_sqrt",
        "train.lr=0.002",
        "train.warmup_updates=3",
    ]
    straight, first, second = [], [], []
    train(
        tiny_config(pairs64, spm_model, tmp_path / "a", *common, "train.max_updates=6"),
        on_update=lambda u, s: straight.append(float(s.loss)),
    )
    train(
        tiny_config(pairs64, spm_model, tmp_path / "b", *common, "train.max_updates=3"),
        on_update=lambda u, s: first.append(float(s.loss)),
    )
    from transformer_mt.training import resumed_config

    cfg = resumed_config(tmp_path / "b", ["train.max_updates=6"])
    assert (cfg.model.activation, cfg.model.position_layout, cfg.model.output_bias) == ("swish", "halves", True)
    train(cfg, resume=True, on_update=lambda u, s: second.append(float(s.loss)))
    assert first + second == pytest.approx(straight, rel=1e-6, abs=1e-6) and len(straight) == 6
    a = load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys() and "output_proj.bias" in a
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)
    kept = a["output_ids"]
    assert a["output_proj.bias"][kept].abs().sum() > 0  # learned on the kept pieces
