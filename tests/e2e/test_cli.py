"""The CLI through its public entry point (transformer_mt.cli:main, installed as `tmt`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import head
from transformer_mt import __version__
from transformer_mt.cli import main


def run(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return exit_.value.code or 0, out.out, out.err


def test_version_and_help(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"tmt {__version__}"
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for command in ("tokenize", "train", "translate", "bleu", "evaluate", "average"):
        assert command in out


def test_tokenize_train_encode_decode(tmp_path, corpus_slice, capsys):
    prefix = tmp_path / "spm"
    code, _, err = run(
        [
            "tokenize",
            "train",
            "-i",
            str(corpus_slice["train.en"]),
            "-i",
            str(corpus_slice["train.de"]),
            "-o",
            str(prefix),
            "--vocab-size",
            "800",
            "--model-type",
            "bpe",
        ],
        capsys,
    )
    assert code == 0 and "spm.model" in err and (tmp_path / "spm.model").is_file()
    enc = tmp_path / "val.ids"
    code, _, _ = run(
        ["tokenize", "encode", "-m", str(prefix) + ".model", str(corpus_slice["val.en"]), "-o", str(enc), "--ids"],
        capsys,
    )
    assert code == 0
    assert len(enc.read_text().splitlines()) == 100
    dec = tmp_path / "val.txt"
    code, _, _ = run(["tokenize", "decode", "-m", str(prefix) + ".model", str(enc), "-o", str(dec), "--ids"], capsys)
    assert code == 0
    original = head(corpus_slice["val.en"], 100)
    assert sum(a == b for a, b in zip(dec.read_text().splitlines(), original)) >= 95


def test_user_errors_are_one_line(tmp_path, capsys):
    code, _, err = run(["tokenize", "encode", "-m", str(tmp_path / "none.model")], capsys)
    assert code == 2 and err.count("\n") == 1 and "none.model: sentencepiece model not found" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  dmodel: 3\n")
    code, _, err = run(["train", "--config", str(bad)], capsys)
    assert code == 2 and "unknown key 'model.dmodel'; did you mean 'd_model'?" in err and "Traceback" not in err


def test_console_script_module_entry(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "transformer_mt.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "tokenize" in out.stdout
