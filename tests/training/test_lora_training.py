"""Parameter-efficient fine-tuning through `tmt train --init-from`: LoRA (train.lora) lowers the validation loss,
resumes bit for bit, writes its adapters beside each checkpoint, decodes unmerged and merges with `tmt merge`;
train.freeze keeps the frozen parts bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.model import is_adapter_name
from transformer_mt.training import train, train_config_from_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _yaml(tmp_path: Path, corpus: dict[str, Path], out: Path, **train_extra) -> Path:
    cfg = {
        "data": {
            "train_src": str(corpus["train.en"]),
            "train_tgt": str(corpus["train.de"]),
            "valid_src": str(corpus["val.en"]),
            "valid_tgt": str(corpus["val.de"]),
        },
        "train": {
            "out_dir": str(out),
            "device": "cpu",
            "threads": 1,
            "lr_schedule": "inverse_sqrt",
            "lr": 0.01,
            "warmup_updates": 2,
            "max_tokens": 2000,
            "max_updates": 8,
            "validate_every": 4,
            "valid_bleu_sentences": -1,
            "best_metric": "loss",
            "log_every": 1,
            "keep_last": 1,
            "seed": 3,
            **train_extra,
        },
    }
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path


def _rows(out: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if r["kind"] == kind]


LORA = {"lora": {"rank": 4, "alpha": 8, "targets": "q,k,v,o,ffn1,ffn2", "dropout": 0.1}}


def _fine_tune(tmp_path, corpus, init: Path, out: Path, **extra) -> None:
    cfg = train_config_from_cli(
        config=_yaml(tmp_path, corpus, out, **extra), overrides=[], resume=None, overwrite=False, init_from=init
    )
    train(cfg)


def test_lora_fine_tuning_lowers_the_loss_resumes_exactly_and_merges(tiny_run, tmp_path, capsys):
    init = tiny_run.checkpoint
    whole = tmp_path / "whole"
    _fine_tune(tmp_path, tiny_run.corpus, init, whole, **LORA)
    losses = [r["val_loss"] for r in _rows(whole, "valid")]
    base_loss = load_checkpoint(init)["metrics"]["val_loss"]  # the same validation set, before fine-tuning
    assert losses[-1] < base_loss, (base_loss, losses)

    # what trained: the adapters only; the base weights are the checkpoint's, bit for bit
    last = load_checkpoint(whole / "checkpoint_last.pt")
    base = load_checkpoint(init)["model"]
    for name, tensor in last["model"].items():
        if not is_adapter_name(name):
            assert torch.equal(tensor, base[name]), name
    assert set(last["optimizer"]["state"]) == set(range(sum(1 for n in last["model"] if is_adapter_name(n))))
    log = (whole / "train.log").read_text(encoding="utf-8")
    assert "parameters (" in log and "Adam states" in log

    # the adapter file beside each checkpoint: the adapters and their config, weights-only
    small = torch.load(whole / "checkpoint_last.adapter.pt", weights_only=True)
    assert small["lora"]["rank"] == 4 and set(small["adapters"]) == {n for n in last["model"] if is_adapter_name(n)}
    assert {p.name for p in whole.glob("*.adapter.pt")} == {
        p.name.removesuffix(".pt") + ".adapter.pt" for p in whole.glob("checkpoint_*.pt") if ".adapter" not in p.name
    }

    # 4 updates, then --resume for 4 more: the same losses and weights as 8 straight
    split = tmp_path / "split"
    _fine_tune(tmp_path, tiny_run.corpus, init, split, max_updates=4, **LORA)
    train(
        train_config_from_cli(config=None, overrides=["train.max_updates=8"], resume=split, overwrite=False),
        resume=True,
    )
    assert [r["loss"] for r in _rows(split, "train")] == [r["loss"] for r in _rows(whole, "train")]
    capsys.readouterr()  # the runs' own log lines
    code, _, err = run_cli(["train", "--resume", split, "--set", "train.lora.rank=8"], capsys)
    assert code == 2 and err.count("\n") == 1 and "train.lora and train.freeze cannot change" in err
    resumed = load_checkpoint(split / "checkpoint_last.pt")
    for name, tensor in last["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name

    # decoding the LoRA checkpoint (merged at load) and its `tmt merge` output give the same translations
    merged = tmp_path / "merged.pt"
    capsys.readouterr()
    code, out, err = run_cli(["merge", "-c", whole / "checkpoint_last.pt", "-o", merged], capsys)
    assert code == 0, err
    plain = load_checkpoint(merged)
    assert not any(is_adapter_name(n) for n in plain["model"]) and plain["config"]["train"]["lora"]["rank"] == 0
    assert any(not torch.equal(plain["model"][n], base[n]) for n in base)  # the adapters were folded in
    import transformer_mt

    lines = tiny_run.corpus["val.en"].read_text(encoding="utf-8").splitlines()[:6]
    a = transformer_mt.load(whole / "checkpoint_last.pt", device="cpu").translate(lines)
    b = transformer_mt.load(merged, device="cpu").translate(lines)
    assert a == b

    capsys.readouterr()
    code, _, err = run_cli(["merge", "-c", init], capsys)  # an ordinary checkpoint: one line, exit 2
    assert code == 2 and err.count("\n") == 1 and "no LoRA adapters" in err


def test_freezing_the_encoder_keeps_its_weights_bit_identical(tiny_run, tmp_path):
    init = tiny_run.checkpoint
    out = tmp_path / "frozen"
    freeze = {"encoder": True, "decoder_layers": 1}
    _fine_tune(tmp_path, tiny_run.corpus, init, out, max_updates=3, freeze=freeze, ema_decay=0.5)
    last = load_checkpoint(out / "checkpoint_last.pt")
    before, after = load_checkpoint(init)["model"], last["model"]
    # the moving average keeps shadows of what trains only; decoding takes them over the frozen weights
    assert last["ema"]["weights"] and not any(n.startswith(("encoder", "decoder.0.")) for n in last["ema"]["weights"])
    import transformer_mt

    assert len(transformer_mt.load(out / "checkpoint_last.pt", device="cpu").translate(["A man.", ""])) == 2
    frozen = [n for n in before if n.startswith(("encoder.", "encoder_norm.", "decoder.0."))]
    trained = [n for n in before if n.startswith("decoder.1.") and n.endswith("weight")]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(before[name], after[name]), name
    assert all(not torch.equal(before[n], after[n]) for n in trained)
    assert not list(out.glob("*.adapter.pt"))


def test_export_of_a_lora_checkpoint_is_of_its_merged_weights(tiny_run, tmp_path, capsys):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path / "lora"
    _fine_tune(tmp_path, tiny_run.corpus, tiny_run.checkpoint, out, max_updates=2, validate_every=2, **LORA)
    ckpt = out / "checkpoint_last.pt"
    capsys.readouterr()
    assert run_cli(["merge", "-c", ckpt, "-o", tmp_path / "merged.pt"], capsys)[0] == 0
    for name in ("checkpoint_last", "merged"):
        source = ckpt if name == "checkpoint_last" else tmp_path / "merged.pt"
        code, _, err = run_cli(["export", "-c", source, "-o", tmp_path / f"ct2_{name}"], capsys)
        assert code == 0, err
    a = ctranslate2.Translator(str(tmp_path / "ct2_checkpoint_last"), device="cpu")
    b = ctranslate2.Translator(str(tmp_path / "ct2_merged"), device="cpu")
    pieces = [["▁A", "▁man", "▁is", "▁riding", "."], ["▁Two", "▁dogs", "."]]
    assert [r.hypotheses for r in a.translate_batch(pieces)] == [r.hypotheses for r in b.translate_batch(pieces)]
    # the adapters changed the model: the export is not the base checkpoint's
    base = tmp_path / "ct2_base"
    assert run_cli(["export", "-c", tiny_run.checkpoint, "-o", base], capsys)[0] == 0
    assert (base / "model.bin").read_bytes() != (tmp_path / "ct2_checkpoint_last" / "model.bin").read_bytes()
    assert (tmp_path / "ct2_merged" / "model.bin").read_bytes() == (
        tmp_path / "ct2_checkpoint_last" / "model.bin"
    ).read_bytes()
