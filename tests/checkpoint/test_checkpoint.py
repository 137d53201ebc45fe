"""Checkpoints: weights_only round trip, atomic save under failure, clear errors, retention, averaging."""

from __future__ import annotations

import errno
import os
import random
import re

import numpy as np
import pytest
import torch
from torch import nn

from transformer_mt.checkpoint import (
    FORMAT,
    CheckpointError,
    average_checkpoints,
    averaging,
    config_from_checkpoint,
    last_checkpoints,
    load_checkpoint,
    model_weights,
    numbered_checkpoint_path,
    pack_tokenizers,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unpack_tokenizers,
)
from transformer_mt.checkpoint import entries as ckpt
from transformer_mt.config import Config, to_dict
from transformer_mt.text import Tokenizer


class Tiny(nn.Module):
    """Float parameters, a half-precision buffer and an integer buffer: every averaging case."""

    def __init__(self, d: int = 8, vocab: int = 11):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)
        self.register_buffer("scale", torch.randn(4).half())
        self.steps: torch.Tensor  # a buffer: typed here, as nn.Module's attributes are dynamic
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))


def tiny_config(d_model: int = 8) -> Config:
    cfg = Config()
    cfg.model.d_model, cfg.model.heads, cfg.model.d_ff = d_model, 2, 16
    cfg.model.encoder_layers = cfg.model.decoder_layers = 1
    return cfg


def training_state(
    seed: int, *, proto: bytes = b"\x00sp\xff", d_model: int = 8, vocab: int = 11, steps: int = 0
) -> dict:
    """A full training-state checkpoint of a Tiny model after one Adam update."""
    torch.manual_seed(seed)
    model = Tiny(d_model, vocab)
    model.steps.fill_(steps)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))
    model.out(model.norm(model.emb(torch.tensor([[1, 2, 3]])))).sum().backward()
    opt.step()
    sched.step()
    return {
        "model": model.state_dict(),
        "config": to_dict(tiny_config(d_model)),
        "tokenizers": pack_tokenizers(proto),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": None,
        "rng": rng_state(),
        "progress": {
            "update": 1,
            "epoch": 1,
            "epoch_batch": 1,
            "best_metric": None,
            "bad_validations": 0,
            "elapsed": 0.5,
        },
        "metrics": {"loss": 2.5, "bleu": 0.0},
    }


def assert_same(a, b, where="state"):
    """Recursive equality of nested dicts / lists / tensors."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# ----------------------------------------------------------------------------- round trip


def test_round_trip_weights_only_with_real_tokenizer(tmp_path, spm_model):
    proto = spm_model.read_bytes()
    state = training_state(1, proto=proto)
    path = save_checkpoint(state, tmp_path / "run" / "checkpoint_last.pt")

    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # like any file the user writes, not 0600
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint_last.pt"]

    raw = torch.load(path, weights_only=True)  # the property the format exists for
    assert raw["format"] == FORMAT
    loaded = load_checkpoint(path)
    assert_same({"format": FORMAT, **state}, loaded)
    assert config_from_checkpoint(loaded) == tiny_config()
    src, tgt = unpack_tokenizers(loaded)
    assert src == tgt == proto
    line = ["Zwei junge Männer stehen im Freien."]
    assert Tokenizer(src).encode(line) == Tokenizer(spm_model).encode(line)
    # the state's optimizer resumes: load it into a fresh optimizer without complaint
    model = Tiny()
    model.load_state_dict(loaded["model"])
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["optimizer"])


def test_rng_state_round_trip_reproduces_random_numbers(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave a cached Gaussian in both states
    save_checkpoint({"rng": rng_state()}, tmp_path / "rng.pt")

    def draw():
        return [random.random(), random.gauss(0, 1)], np.random.randn(3).tolist(), torch.rand(4)

    expected = draw()
    draw()  # move every generator on
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    got = draw()
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_bytes_helpers_round_trip():
    data = bytes(range(256)) * 3
    t = ckpt.bytes_to_tensor(data)
    assert t.dtype == torch.uint8 and t.shape == (768,)
    assert ckpt.tensor_to_bytes(t) == data
    assert ckpt.tensor_to_bytes(ckpt.bytes_to_tensor(b"")) == b""


def test_non_plain_values_refused_before_writing(tmp_path):
    path = tmp_path / "c.pt"
    with pytest.raises(CheckpointError) as err:
        save_checkpoint({"progress": {"best_metric": np.float64(1.5)}}, path)
    assert str(err.value) == (
        "checkpoint state['progress']['best_metric'] is a numpy.float64, which torch.load(weights_only=True) refuses; "
        "convert it to a tensor, str, int, float, bool, list or dict"
    )
    with pytest.raises(CheckpointError, match=r"state\['tokenizers'\]\['src'\] is bytes.*bytes_to_tensor"):
        save_checkpoint({"tokenizers": {"src": b"proto"}}, path)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- failure during save


def _partial_save(exc: BaseException):
    """A torch.save that writes part of a zip archive, then fails."""

    def fake_save(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04" + b"\x00" * 4096)
        raise exc

    return fake_save


@pytest.mark.parametrize(
    "exc, message",
    [
        (
            OSError(errno.ENOSPC, "No space left on device"),
            "could not save checkpoint to {path}: No space left on device; free space or change train.out_dir; the "
            "previous checkpoint is intact",
        ),
        (
            RuntimeError("simulated crash mid-write"),
            "could not save checkpoint to {path}: RuntimeError: simulated crash mid-write; "
            "this is a bug in what was saved or in transformer_mt; please report it; the previous checkpoint is intact",
        ),
    ],
    ids=["ENOSPC", "crash"],
)
def test_failure_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch, exc, message):
    path = save_checkpoint(training_state(1), tmp_path / "checkpoint_last.pt")
    before = path.read_bytes()

    monkeypatch.setattr(torch, "save", _partial_save(exc))
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(training_state(2), path)
    monkeypatch.undo()

    assert str(err.value) == message.format(path=path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]  # no temp file left
    assert path.read_bytes() == before
    assert_same(load_checkpoint(path)["model"], training_state(1)["model"])


def test_fsync_failure_after_full_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    """The real torch.save completes, then the data cannot reach the disk."""
    path = save_checkpoint(training_state(1), tmp_path / "checkpoint_last.pt")
    before = path.read_bytes()

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(
        CheckpointError,
        match="No space left on device; free space or change train.out_dir; the previous checkpoint is intact",
    ):
        save_checkpoint(training_state(2), path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]
    assert path.read_bytes() == before


def test_interrupt_mid_write_cleans_up_and_propagates(tmp_path, monkeypatch):
    path = save_checkpoint(training_state(1), tmp_path / "checkpoint_last.pt")
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", _partial_save(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(training_state(2), path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]
    assert path.read_bytes() == before


def test_failure_with_no_previous_checkpoint_says_none_was_written(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_7.pt"
    monkeypatch.setattr(torch, "save", _partial_save(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(CheckpointError) as err:
        save_checkpoint({"model": {}}, path)
    assert str(err.value).endswith("free space or change train.out_dir; no checkpoint was written")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- load errors


@pytest.mark.parametrize("keep", [0, 10, 0.5, -64], ids=["empty", "10-bytes", "half", "tail-cut"])
def test_truncated_file_is_reported(tmp_path, keep):
    good = save_checkpoint(training_state(1), tmp_path / "checkpoint_5.pt").read_bytes()
    n = int(len(good) * keep) if isinstance(keep, float) else (len(good) + keep if keep < 0 else keep)
    bad = tmp_path / "checkpoint_6.pt"
    bad.write_bytes(good[:n])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    msg = str(err.value)
    assert msg.startswith(f"{bad}: checkpoint is truncated or corrupt (")
    assert msg.endswith(
        "); use another one, e.g. checkpoint_last.pt or a numbered checkpoint_<update>.pt from the same run"
    )
    assert "\n" not in msg
    if n == 0:
        assert "(the file is empty)" in msg


def test_missing_and_foreign_files_are_reported(tmp_path):
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "nope.pt")
    assert str(err.value) == (
        f"{tmp_path / 'nope.pt'}: checkpoint not found; give a .pt file from train.out_dir (checkpoint_last.pt, "
        "checkpoint_best.pt or checkpoint_<update>.pt)"
    )

    plain = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(2)}, plain)  # loads fine, but is not ours
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(plain)
    assert str(err.value) == (
        f"{plain}: not a transformer_mt checkpoint (no 'format' key); give a checkpoint written by `tmt train` or "
        "`tmt average`"
    )

    pickled = tmp_path / "pickled.pt"
    torch.save({"format": FORMAT, "model": nn.Linear(2, 2)}, pickled)  # a whole module: refused by weights_only
    with pytest.raises(CheckpointError, match="not a transformer_mt checkpoint .*weights_only loading refuses"):
        load_checkpoint(pickled)


# ----------------------------------------------------------------------------- retention


def test_prune_keeps_newest_numbered_and_never_best_or_last(tmp_path):
    for update in (1, 2, 3, 10, 11, 100):  # name order (1, 10, 100, 11, 2, 3) differs from numeric order
        numbered_checkpoint_path(tmp_path, update).write_bytes(b"x")
    others = ["checkpoint_best.pt", "checkpoint_last.pt", "checkpoint_final.pt", ".checkpoint_4.pt.abc.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"x")

    assert prune_checkpoints(tmp_path, 0) == []  # 0 = keep all
    removed = prune_checkpoints(tmp_path, 2)
    assert [p.name for p in removed] == ["checkpoint_1.pt", "checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_10.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others + ["checkpoint_11.pt", "checkpoint_100.pt"])
    assert prune_checkpoints(tmp_path, 2) == []

    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint_11.pt", "checkpoint_100.pt"]
    with pytest.raises(CheckpointError) as err:
        last_checkpoints(tmp_path, 5)
    assert str(err.value) == (
        f"{tmp_path}: asked for the last 5 checkpoints but the run has 2 numbered checkpoint_<update>.pt files; "
        "ask for fewer or raise train.keep_last for the next run"
    )


# ----------------------------------------------------------------------------- averaging


def test_average_is_elementwise_mean(tmp_path):
    states = [
        training_state(seed, proto=b"proto", steps=seed) for seed in (1, 2, 3)
    ]  # one tokenizer: averaging refuses two
    paths = [save_checkpoint(s, numbered_checkpoint_path(tmp_path, 100 * i)) for i, s in enumerate(states, 1)]

    two = average_checkpoints(paths[:2])
    a, b = states[0]["model"], states[1]["model"]
    for name in ("emb.weight", "norm.weight", "norm.bias", "out.weight", "out.bias"):
        torch.testing.assert_close(two["model"][name], (a[name] + b[name]) / 2, rtol=0, atol=1e-7)
    expected_scale = ((a["scale"].float() + b["scale"].float()) / 2).half()
    torch.testing.assert_close(two["model"]["scale"], expected_scale, rtol=1e-3, atol=1e-3)
    assert two["model"]["scale"].dtype == torch.float16
    assert two["model"]["steps"].item() == 2  # integer buffer: from the last checkpoint
    assert unpack_tokenizers(two) == (b"proto", b"proto")  # the shared tokenizer is kept
    assert two["config"] == states[1]["config"]
    assert not set(averaging.TRAINING_KEYS) & two.keys()  # an inference checkpoint
    assert two["averaged_from"] == [str(p) for p in paths[:2]]

    three = average_checkpoints(last_checkpoints(tmp_path, 3))
    c = states[2]["model"]
    torch.testing.assert_close(three["model"]["out.weight"], (a["out.weight"] + b["out.weight"] + c["out.weight"]) / 3)

    out = save_checkpoint(three, tmp_path / "average.pt")  # the result is itself a valid checkpoint
    assert_same(load_checkpoint(out)["model"], three["model"])


def test_average_refuses_different_architectures(tmp_path):
    base = save_checkpoint(training_state(1), tmp_path / "a.pt")
    wider = save_checkpoint(training_state(2, d_model=16), tmp_path / "b.pt")
    with pytest.raises(CheckpointError) as err:
        average_checkpoints([base, wider])
    assert str(err.value) == (
        f"cannot average {base} and {wider}: model.d_model differs (8 vs 16); average checkpoints of one run (or of "
        "identically configured runs)"
    )

    bigger_vocab = save_checkpoint(training_state(3, vocab=12), tmp_path / "c.pt")  # same config, other shapes
    with pytest.raises(CheckpointError) as err:
        average_checkpoints([base, bigger_vocab])
    assert str(err.value) == (
        f"cannot average {base} and {bigger_vocab}: parameter 'emb.weight' differs (shape [11, 8] float32 vs shape "
        "[12, 8] float32); average checkpoints of one run (or of identically configured runs)"
    )


def test_model_weights_checks_every_entry_before_casting_any():
    from tests.hostile import address_space_limit

    state = {"model": {"emb.weight": torch.zeros(3, 4)}, "ema": {"decay": 0.9}}
    with pytest.raises(CheckpointError, match=r"ema.*weights.*--weights raw"):
        model_weights(state, source="x.pt")
    assert model_weights(state, weights="raw", source="x.pt") is state["model"]  # the trained weights need no EMA
    # an EMA weight of 10^10 half floats that the file holds as one (stride 0): cast to float32 it would take 40 GB
    state["ema"] = {
        "decay": 0.9,
        "updates": 1,
        "weights": {"emb.weight": torch.zeros(1, dtype=torch.float16).expand(100_000, 100_000)},
    }
    state["model"] = {"emb.weight": torch.zeros(1).expand(100_000, 100_000)}
    with (
        address_space_limit(),
        pytest.raises(CheckpointError, match=r"x.pt: .*emb.weight.*\(100000, 100000\).*more numbers than the file"),
    ):
        model_weights(state, source="x.pt")
    for bad, words in (
        ({"model": {"emb.weight": "x"}}, "'model' entry emb.weight is not a named tensor"),
        ({"model": {3: torch.zeros(1)}}, "'model' entry 3 is not a named tensor"),
        (
            {"model": {"a": torch.zeros(2)}, "ema": {"weights": {"a": torch.zeros(3)}}},
            "EMA weight a is torch.float32 (3,)",
        ),
        ({"model": {"a": torch.zeros(2)}, "ema": [1]}, "'ema' entry holds no 'weights'"),
    ):
        with pytest.raises(CheckpointError, match=re.escape(words)):
            model_weights(bad, source="x.pt")


def test_tokenizer_entries_must_be_byte_tensors(tmp_path):
    for entry in ({"src": "abc", "tgt": "abc"}, {"src": torch.zeros(3), "tgt": torch.zeros(3)}):
        with pytest.raises(CheckpointError, match=r"x.pt: its tokenizers' 'src' is not a sentencepiece model"):
            unpack_tokenizers({"tokenizers": entry}, source="x.pt")
    with pytest.raises(CheckpointError, match="expected a 1-D uint8 tensor of bytes, got a str"):
        ckpt.tensor_to_bytes("abc")  # type: ignore[arg-type]


def test_mapped_load_gives_the_saved_tensors(tmp_path):
    state = training_state(0)
    save_checkpoint(state, tmp_path / "c.pt")
    assert_same(load_checkpoint(tmp_path / "c.pt", mmap=True)["model"], state["model"])
