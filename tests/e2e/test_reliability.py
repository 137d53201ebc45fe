"""Nothing lost, nothing run, no tracebacks: bad input and failing disks end in one clear error line, with every
earlier file intact.

Here configs, allocation bounds, torch versions, averaging and failing disks; the table of bad command lines is
in test_bad_command_lines.py, extreme settings and damaged files in test_extreme_inputs.py.
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from tests.e2e.conftest import write
from transformer_mt.checkpoint import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    pack_tokenizers,
    save_checkpoint,
)
from transformer_mt.checkpoint.io import _check_torch_is_safe
from transformer_mt.config import Config, ConfigError, load_config, to_dict
from transformer_mt.decoding import Translator


# ---------------------------------------------------------------- config values
@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf", "1e999"])
def test_non_finite_numbers_are_refused(value):
    with pytest.raises(ConfigError, match="train.lr: expected a finite number"):
        load_config(None, [f"train.lr={value}"])


def test_non_finite_integer_is_refused():
    with pytest.raises(ConfigError, match="train.max_tokens: expected an integer"):
        load_config(None, ["train.max_tokens=.inf"])


def test_duplicate_yaml_keys_are_refused(tmp_path):
    path = write(tmp_path / "c.yaml", "train:\n  lr: 0.001\n  max_tokens: 100\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 4: key 'lr' appears twice"):
        load_config(path)


def test_duplicate_sections_are_refused(tmp_path):
    path = write(tmp_path / "c.yaml", "train:\n  lr: 0.001\nmodel:\n  heads: 4\ntrain:\n  max_tokens: 100\n")
    with pytest.raises(ConfigError, match="key 'train' appears twice"):
        load_config(path)


@pytest.mark.parametrize("path", ["", " "])
def test_empty_config_path_says_so(path):
    with pytest.raises(ConfigError, match="--config: the path is empty"):
        load_config(path)


def test_directory_as_config_names_resume(tmp_path):
    with pytest.raises(ConfigError, match="is a directory.*--resume"):
        load_config(tmp_path)


def test_half_a_validation_pair_is_refused(tmp_path):
    src = write(tmp_path / "v.en", "a\n")
    with pytest.raises(ConfigError, match="data.valid_tgt: is empty while data.valid_src is set"):
        load_config(None, [f"data.valid_src={src}"])


@pytest.mark.parametrize("override", ["train.optimizer_betas=[0.9, 0.98", "train.out_dir=@x", "model.norm={pre"])
def test_set_value_that_is_not_yaml_is_one_line(override, capsys, tmp_path):
    config = write(tmp_path / "c.yaml", "train:\n  lr: 0.001\n")
    code, _, err = run_cli(["train", "--config", str(config), "--set", override], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("tmt: error: --set ") and "not valid YAML" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- configs bound what they allocate
@pytest.mark.parametrize(
    "override",
    [
        "model.d_model=10000000",
        "model.max_positions=1000000000",
        "model.encoder_layers=100000",
        "decode.max_len_b=1000000000",
        "decode.beam=100000",
        "model.d_ff=1000000000",
    ],
)
def test_huge_sizes_are_refused(override):
    with pytest.raises(ConfigError, match="above the supported maximum"):
        load_config(None, [override])


def test_sizes_that_multiply_to_too_many_parameters_are_refused():
    with pytest.raises(ConfigError, match="parameters, above the supported"):
        load_config(
            None, ["model.d_model=65536", "model.d_ff=1048576", "model.encoder_layers=1000", "model.heads=1024"]
        )


def test_crafted_checkpoint_is_refused_before_allocating(tmp_path):
    """A few-KB checkpoint whose config asks for a huge model: refused with one line, no big allocation."""
    raw = to_dict(Config())
    raw["model"]["d_model"] = 2**24  # 16M-wide embeddings: terabytes for any vocabulary
    path = save_checkpoint({"model": {}, "config": raw, "tokenizers": pack_tokenizers(b"x")}, tmp_path / "evil.pt")
    assert path.stat().st_size < 20_000
    tracemalloc.start()
    with pytest.raises(CheckpointError, match="model.d_model: 16777216 is above the supported maximum"):
        Translator.from_checkpoint(path, device="cpu")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20


# ---------------------------------------------------------------- torch versions with unsafe weights-only loading
@pytest.mark.parametrize("version", ["2.2.0", "2.5.1+cu124", "2.9.1", "1.13.1"])
def test_unsafe_torch_versions_refuse_to_load(version, tmp_path, monkeypatch):
    path = save_checkpoint({"model": {}}, tmp_path / "c.pt")
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(CheckpointError, match=f"torch {re.escape(version)} cannot load checkpoints safely"):
        load_checkpoint(path)


@pytest.mark.parametrize("version", ["2.10.0", "2.13.0+cpu", "3.0.0"])
def test_safe_torch_versions_pass(version):
    _check_torch_is_safe(version)


def test_pyproject_requires_a_safe_torch():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert '"torch>=2.10"' in text


# ---------------------------------------------------------------- averaging refuses different tokenizers
def test_average_refuses_different_sentencepiece_models(tmp_path):
    cfg = to_dict(Config())
    weights = {"w": torch.ones(3)}
    a = save_checkpoint({"model": weights, "config": cfg, "tokenizers": pack_tokenizers(b"model A")}, tmp_path / "a.pt")
    b = save_checkpoint({"model": weights, "config": cfg, "tokenizers": pack_tokenizers(b"model B")}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="their sentencepiece models differ"):
        average_checkpoints([a, b])


# ---------------------------------------------------------------- OS errors are one line
def test_out_dir_that_is_a_file_is_one_line(tmp_path, corpus_slice):
    blocker = write(tmp_path / "blocker", "x")
    config = write(
        tmp_path / "c.yaml",
        f"data:\n  train_src: {corpus_slice['train.en']}\n  train_tgt: {corpus_slice['train.de']}\n",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "transformer_mt.cli",
            "train",
            "-c",
            str(config),
            "--set",
            f"train.out_dir={blocker}/run",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(blocker) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- a full disk is one line naming the file
def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_output_names_the_file_and_keeps_its_bytes(tmp_path, bad_inputs, monkeypatch, capsys):
    from transformer_mt.text import textio

    out = write(tmp_path / "out.txt", "yesterday's results\n")
    monkeypatch.setattr(textio.os, "fsync", enospc)  # the disk fills up as the new output is completed
    code, _, err = run_cli(["tokenize", "encode", "-m", bad_inputs["spm"], bad_inputs["src"], "-o", str(out)], capsys)
    assert code == 2 and err == f"tmt: error: {out}: No space left on device; free some disk space or write elsewhere\n"
    assert out.read_bytes() == b"yesterday's results\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full")
def test_writing_to_dev_full_names_it(bad_inputs, capsys):
    code, _, err = run_cli(["translate", "-c", bad_inputs["ckpt"], bad_inputs["src"], "-o", "/dev/full"], capsys)
    assert code == 2 and err.startswith("tmt: error: /dev/full: No space left on device") and err.count("\n") == 1, err
    assert Path("/dev/full").is_char_device()  # written to, never replaced


def test_disk_full_on_stdout_names_stdout(bad_inputs, monkeypatch, capsys):
    class FullStdout(io.StringIO):
        write = flush = enospc

    monkeypatch.setattr(sys, "stdout", FullStdout())
    code, _, err = run_cli(["bleu", "-r", bad_inputs["ref"], bad_inputs["ref"]], capsys)
    assert code == 2 and err.startswith("tmt: error: <stdout>: No space left on device") and err.count("\n") == 1, err


def test_disk_full_while_writing_the_cache_is_one_line(tmp_path, bad_inputs, monkeypatch, capsys):
    from transformer_mt.data import encoded as encoded_module

    def numpy_full(*_args, **_kwargs):  # what ndarray.tofile raises on a full disk: no errno, no file name
        raise OSError("40000 requested and 0 written")

    monkeypatch.setattr(encoded_module.CacheWriter, "add", numpy_full)
    cache = tmp_path / "cache"
    code, _, err = run_cli(["preprocess", "-c", bad_inputs["cfg"], "--set", f"data.cache_dir={cache}"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and line.startswith(f"tmt: error: {cache}/train.en-train.de-"), err
    assert "could not write the encoded corpus cache (40000 requested and 0 written); free disk space" in line
    assert list(cache.iterdir()) == []  # the half-written temporary directory is gone


def test_checkpoint_never_replaces_a_device_or_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="exists and is not a regular file"):
        save_checkpoint({"model": {}}, fifo)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
