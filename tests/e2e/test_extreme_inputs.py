"""No traceback from extreme settings or damaged files: a beam larger than the vocabulary, extreme length
penalties, damaged checkpoints, huge position tables, pipes and devices as inputs."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli
from tests.e2e.conftest import write
from transformer_mt.checkpoint import load_checkpoint, save_checkpoint
from transformer_mt.config import ConfigError, load_config
from transformer_mt.decoding import SearchError, Translator


# ---------------------------------------------------------------- a beam is checked against the vocabulary first
def test_translator_refuses_a_huge_beam_before_encoding(bad_inputs, monkeypatch):
    tr = Translator.from_checkpoint(bad_inputs["ckpt"], device="cpu")
    vocab = (
        tr.tgt_tok.vocab_size
    )  # 1000: ids that may follow a prefix are all but PAD and BOS, and a step ranks 2 x beam of them
    assert (
        len(tr.translate_batch(["a dog ."], beam=(vocab - 2) // 2, lenpen=0.6).hypotheses[0]) == 1
    )  # the largest beam allowed runs
    monkeypatch.setattr(tr.src_tok, "encode", lambda *_: pytest.fail("encoded before refusing the beam"))
    tracemalloc.start()
    with pytest.raises(
        SearchError, match=f"beam=100000 needs a target vocabulary of at least 200002 ids, the model has {vocab}"
    ):
        tr.translate(["a dog ."], beam=100_000, lenpen=0.6)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20
    with pytest.raises(SearchError, match="use a beam of at most 499"):
        tr.translate(["a dog ."], beam=vocab // 2, lenpen=0.6)


# ---------------------------------------------------------------- no traceback from extreme settings or damaged files
@pytest.mark.parametrize("lenpen", ["1e308", "1000", "-1e308"])
def test_extreme_lenpen_is_one_line(bad_inputs, capsys, lenpen):
    code, _, err = run_cli(["translate", "-c", bad_inputs["ckpt"], "--lenpen", lenpen, bad_inputs["src"]], capsys)
    assert (
        code == 2
        and err.startswith(f"tmt: error: --lenpen {float(lenpen)} is out of range; use -10 to 10")
        and err.count("\n") == 1
    )


def test_length_penalty_never_overflows():
    from transformer_mt.config import lenpen_problem
    from transformer_mt.decoding import length_penalty

    assert (
        length_penalty(1000, 1e308) == math.inf and length_penalty(2, 0.6) == (7 / 6) ** 0.6
    )  # normal values: the same float
    assert lenpen_problem(10.0) is None and lenpen_problem(-10.0) is None and lenpen_problem(10.5) is not None


@pytest.mark.parametrize(
    ("args", "words"),
    [(["--port", "99999"], "--port 99999: must be 0 to 65535"), (["--log-level", "nope"], "--log-level nope: choose")],
)
def test_serve_bad_port_or_log_level_is_one_line(capsys, args, words):
    pytest.importorskip("uvicorn")
    code, _, err = run_cli(["serve", "-c", "no-such.pt", *args], capsys)
    assert code == 2 and err.startswith(f"tmt: error: {words}") and err.count("\n") == 1


def test_mbr_superscript_index_is_one_line(tmp_path, capsys):
    nbest = write(tmp_path / "nbest.txt", "0\t-1.0\tein Hund\n\u00b2\t-2.0\tzwei Hunde\n")
    code, _, err = run_cli(["mbr", str(nbest)], capsys)
    assert (
        code == 2
        and err.startswith(f"tmt: error: {nbest}:2: expected INDEX<TAB>SCORE<TAB>TEXT")
        and err.count("\n") == 1
    )


def _damaged(bad_inputs, path: Path, damage) -> str:
    state = load_checkpoint(bad_inputs["ckpt"])
    damage(state)
    save_checkpoint(state, path)
    return str(path)


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda s: s["config"]["model"].update(d_model=64), "the weights do not fit its config"),
        (
            lambda s: s["tokenizers"].update(src=torch.tensor([1, 2, 3], dtype=torch.uint8)),
            "sentencepiece model 'src' is corrupt",
        ),
        (lambda s: s.pop("model"), "holds no 'model' weights"),
    ],
    ids=["config-weights", "tokenizer-blob", "no-model"],
)
def test_damaged_checkpoint_is_one_line(bad_inputs, tmp_path, capsys, damage, words):
    ckpt = _damaged(bad_inputs, tmp_path / "damaged.pt", damage)
    code, _, err = run_cli(["translate", "-c", ckpt, bad_inputs["src"]], capsys)
    assert code == 2 and err.startswith(f"tmt: error: {ckpt}: ") and words in err and err.count("\n") == 1, err


def test_position_table_too_large_is_refused_before_allocating(bad_inputs, tmp_path, capsys, monkeypatch):
    def damage(state):
        state["config"]["model"].update(max_positions=2**20, positions="sinusoidal")
        state["config"]["decode"].update(max_len_a=64, max_len_b=2**20)
        state["model"] = {k: v for k, v in state["model"].items() if "pos" not in k}

    ckpt = _damaged(bad_inputs, tmp_path / "huge.pt", damage)
    from transformer_mt.model import positions as positions_module

    built: list[int] = []
    sinusoids = positions_module.sinusoids

    def counting_sinusoids(n: int, *a: Any, **k: Any) -> torch.Tensor:
        built.append(n)
        return sinusoids(min(n, 2**21), *a, **k)

    monkeypatch.setattr(positions_module, "sinusoids", counting_sinusoids)
    code, _, err = run_cli(["translate", "-c", ckpt, bad_inputs["src"]], capsys)
    assert (
        code == 2
        and "model.max_positions" in err
        and "decode.max_len_a" in err
        and "decode.max_len_b" in err
        and err.count("\n") == 1
    ), err
    assert (
        max(built, default=0) <= 2**20
    )  # the model's own table (model.max_positions), never the 68M rows decoding would need


def test_pipes_fifos_and_devices_are_inputs(bad_inputs, tmp_path, capsys):
    src = Path(bad_inputs["src"])
    lines = src.read_text(encoding="utf-8").count("\n")
    code, _, err = run_cli(["translate", "-c", bad_inputs["ckpt"], "/dev/null"], capsys)
    assert code == 0 and err == ""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as w:
            w.write(src.read_bytes())

    import threading

    writer = threading.Thread(target=feed)
    writer.start()
    out = tmp_path / "out.txt"
    code, _, err = run_cli(["translate", "-c", bad_inputs["ckpt"], str(fifo), "-o", str(out)], capsys)
    writer.join()
    assert code == 0 and out.read_text(encoding="utf-8").count("\n") == lines, err
    tmt = Path(sys.executable).with_name("tmt")
    shell = f"{tmt} bleu --ref <(cat {bad_inputs['ref']}) <(cat {bad_inputs['ref']})"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True)
    assert done.returncode == 0 and "100.0" in done.stdout, done.stderr
    done = subprocess.run(
        ["bash", "-c", f"{tmt} translate -c {bad_inputs['ckpt']} <(cat {src})"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.count("\n") == lines, done.stderr
    code, _, err = run_cli(["translate", "-c", bad_inputs["ckpt"], str(tmp_path)], capsys)
    assert code == 2 and err == f"tmt: error: {tmp_path}: is a directory, not a text file\n"


def test_config_refuses_an_extreme_lenpen():
    with pytest.raises(ConfigError, match=r"decode.lenpen: 1e\+308 is out of range; use -10 to 10"):
        load_config(None, ["decode.lenpen=1e308"])
    assert load_config(None, ["decode.lenpen=1.5"]).decode.lenpen == 1.5


def test_mbr_reads_process_substitution(tmp_path):
    tmt = Path(sys.executable).with_name("tmt")
    done = subprocess.run(
        ["bash", "-c", f"{tmt} mbr <(printf 'ein Hund\\nzwei\\n') <(printf 'ein Hund\\ndrei\\n')"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.split("\n")[0] == "ein Hund" and done.stdout.count("\n") == 2, (
        done.stderr
    )
