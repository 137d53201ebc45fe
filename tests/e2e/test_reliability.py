"""Nothing lost, nothing run, no tracebacks: bad input and failing disks end in one clear error line, with every earlier file intact."""

from __future__ import annotations

import errno
import io
import math
import os
import re
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

from transformer_mt.checkpoint import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    pack_tokenizers,
    save_checkpoint,
)
from transformer_mt.checkpoint.io import _check_torch_is_safe
from transformer_mt.cli import main
from transformer_mt.config import Config, ConfigError, load_config, to_dict
from transformer_mt.decoding import SearchError, Translator


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of `tmt ARGV` run in this process."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert isinstance(exc.value.code, int), exc.value.code  # main exits with a number, never a message
    return exc.value.code, capsys.readouterr().err


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- item 13: config values
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
    code, err = run_cli(["train", "--config", str(config), "--set", override], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.startswith("tmt: error: --set ") and "not valid YAML" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- item 9: configs bound what they allocate
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


# ---------------------------------------------------------------- item 8: torch versions with unsafe weights-only loading
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


# ---------------------------------------------------------------- item 6: averaging refuses different tokenizers
def test_average_refuses_different_sentencepiece_models(tmp_path):
    cfg = to_dict(Config())
    weights = {"w": torch.ones(3)}
    a = save_checkpoint({"model": weights, "config": cfg, "tokenizers": pack_tokenizers(b"model A")}, tmp_path / "a.pt")
    b = save_checkpoint({"model": weights, "config": cfg, "tokenizers": pack_tokenizers(b"model B")}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="their sentencepiece models differ"):
        average_checkpoints([a, b])


# ---------------------------------------------------------------- item 10: OS errors are one line
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


# ---------------------------------------------------------------- item 10: a table of bad command lines
# Each row: tmt's arguments and what the error must name (the file, the key, the line or the option).
# {ckpt}: a tiny checkpoint; {spm}: its sentencepiece model; {src}/{ref}: 100 val lines (en/de);
# {long_ref}: 2000 lines; {bad_utf8}: line 2 in latin-1; {cfg}: a valid training config; {tmp}: a scratch dir.
BAD_COMMANDS = [
    # tokenize
    ("tok-train-missing-input", "tokenize train -i {tmp}/missing.txt -o {tmp}/sp", "{tmp}/missing.txt"),
    ("tok-train-vocab-0", "tokenize train -i {src} -o {tmp}/sp --vocab-size 0", "'--vocab-size'"),
    (
        "tok-train-sentences-negative",
        "tokenize train -i {src} -o {tmp}/sp --input-sentence-size -1",
        "'--input-sentence-size'",
    ),
    ("tok-train-model-type", "tokenize train -i {src} -o {tmp}/sp --model-type word2", "'word2'"),
    ("tok-train-prefix-through-file", "tokenize train -i {src} -o {src}/sp", "{src}"),
    ("tok-train-invalid-utf8", "tokenize train -i {bad_utf8} -o {tmp}/sp", "{bad_utf8}:2"),
    ("tok-encode-missing-model", "tokenize encode -m {tmp}/missing.model {src}", "{tmp}/missing.model"),
    ("tok-encode-text-as-model", "tokenize encode -m {src} {src}", "{src}: not a sentencepiece model"),
    ("tok-encode-missing-input", "tokenize encode -m {spm} {tmp}/missing.txt", "{tmp}/missing.txt"),
    ("tok-encode-output-is-model", "tokenize encode -m {spm} {src} -o {spm}", "the output is the input file"),
    ("tok-encode-invalid-utf8", "tokenize encode -m {spm} {bad_utf8}", "{bad_utf8}:2"),
    ("tok-decode-not-ids", "tokenize decode -m {spm} --ids {src}", "{src}:1"),
    # train
    ("train-no-config", "train", "--config"),
    ("train-missing-config", "train -c {tmp}/missing.yaml", "{tmp}/missing.yaml"),
    ("train-config-not-a-mapping", "train -c {src}", "{src}"),
    ("train-unknown-key", "train -c {cfg} --set train.lrr=0.1", "train.lrr"),
    ("train-unknown-section", "train -c {cfg} --set trian.lr=0.1", "trian"),
    ("train-set-without-equals", "train -c {cfg} --set train.lr", "--set"),
    ("train-set-not-yaml", "train -c {cfg} --set train.optimizer_betas=[0.9,", "--set"),
    ("train-negative-lr", "train -c {cfg} --set train.lr=-1", "train.lr"),
    ("train-nan-lr", "train -c {cfg} --set train.lr=.nan", "train.lr"),
    ("train-string-for-int", "train -c {cfg} --set train.max_tokens=many", "train.max_tokens"),
    ("train-heads-not-dividing", "train -c {cfg} --set model.d_model=30 --set model.heads=4", "model.d_model"),
    ("train-huge-model", "train -c {cfg} --set model.d_model=10000000", "model.d_model"),
    ("train-dropout-one", "train -c {cfg} --set model.dropout=1.0", "model.dropout"),
    ("train-bad-choice", "train -c {cfg} --set model.norm=middle", "model.norm"),
    ("train-missing-train-file", "train -c {cfg} --set data.train_src={tmp}/missing.en", "data.train_src"),
    ("train-half-validation-pair", "train -c {cfg} --set data.valid_src={src}", "data.valid_tgt"),
    (
        "train-max-len-over-positions",
        "train -c {cfg} --set data.max_len=600 --set model.max_positions=512",
        "data.max_len",
    ),
    ("train-resume-nowhere", "train --resume {tmp}/no_run", "{tmp}/no_run"),
    ("train-out-dir-through-file", "train -c {cfg} --set train.out_dir={src}/run", "{src}"),
    ("train-duplicate-key", "train -c {dup_cfg}", "{dup_cfg}: line 3"),
    # translate
    ("tr-missing-checkpoint", "translate -c {tmp}/missing.pt {src}", "{tmp}/missing.pt"),
    ("tr-text-as-checkpoint", "translate -c {src} {src}", "{src}: not a transformer_mt checkpoint"),
    ("tr-directory-as-checkpoint", "translate -c {tmp} {src}", "{tmp}: is a directory"),
    ("tr-missing-input", "translate -c {ckpt} {tmp}/missing.en", "{tmp}/missing.en"),
    ("tr-beam-beyond-vocabulary", "translate -c {ckpt} {src} --beam 100000", "--beam 100000"),
    ("tr-beam-zero", "translate -c {ckpt} {src} --beam 0", "--beam 0"),
    ("tr-nbest-zero", "translate -c {ckpt} {src} --nbest 0", "--nbest 0"),
    ("tr-nbest-over-beam", "translate -c {ckpt} {src} --beam 2 --nbest 3", "--nbest 3"),
    ("tr-lenpen-nan", "translate -c {ckpt} {src} --lenpen nan", "--lenpen nan"),
    ("tr-batch-tokens-zero", "translate -c {ckpt} {src} --batch-tokens 0", "'--batch-tokens'"),
    ("tr-threads-negative", "translate -c {ckpt} {src} --threads -1", "'--threads'"),
    ("tr-beam-not-a-number", "translate -c {ckpt} {src} --beam wide", "'--beam'"),
    ("tr-device", "translate -c {ckpt} {src} --device gpu", "'gpu'"),
    ("tr-dtype", "translate -c {ckpt} {src} --dtype float8", "'float8'"),
    ("tr-output-is-input", "translate -c {ckpt} {src} -o {src}", "the output is the input file"),
    ("tr-output-through-file", "translate -c {ckpt} {src} -o {src}/out.de", "{src}"),
    ("tr-invalid-utf8", "translate -c {ckpt} {bad_utf8}", "{bad_utf8}:2"),
    # evaluate
    ("ev-missing-ref", "evaluate -c {ckpt} --src {src} --ref {tmp}/missing.de", "{tmp}/missing.de"),
    ("ev-ref-line-count", "evaluate -c {ckpt} --src {src} --ref {long_ref} -o {tmp}/hyp", "{long_ref} has 2000"),
    ("ev-beam-beyond-vocabulary", "evaluate -c {ckpt} --src {src} --ref {ref} --beam 100000", "--beam 100000"),
    ("ev-output-is-ref", "evaluate -c {ckpt} --src {src} --ref {ref} -o {ref}", "the output is the input file"),
    # bleu
    ("bleu-width-negative", "bleu -r {ref} {ref} -w -1", "'--width'"),
    ("bleu-width-huge", "bleu -r {ref} {ref} -w 1000000000", "'--width'"),
    ("bleu-missing-ref", "bleu -r {tmp}/missing.de {ref}", "{tmp}/missing.de"),
    ("bleu-tokenizer", "bleu -r {ref} {ref} -tok nope", "'nope'"),
    ("bleu-line-count", "bleu -r {long_ref} {ref}", "{long_ref} has 2000"),
    ("bleu-invalid-utf8", "bleu -r {ref} {bad_utf8}", "{bad_utf8}:2"),
    # average
    ("avg-one-checkpoint", "average {ckpt} -o {tmp}/avg.pt", "at least two checkpoints"),
    ("avg-run-without-numbered", "average --run {tmp} --last 2 -o {tmp}/avg.pt", "{tmp}"),
    ("avg-last-zero", "average --run {tmp} --last 0 -o {tmp}/avg.pt", "'--last'"),
    ("avg-text-as-checkpoint", "average {ckpt} {src} -o {tmp}/avg.pt", "{src}"),
    ("avg-output-is-input", "average {ckpt} {ckpt2} -o {ckpt2}", "the output is the input checkpoint"),
    ("avg-output-fifo", "average {ckpt} {ckpt2} -o {fifo}", "{fifo}: exists and is not a regular file"),
    # preprocess
    ("pre-missing-config", "preprocess -c {tmp}/missing.yaml", "{tmp}/missing.yaml"),
    ("pre-bad-value", "preprocess -c {cfg} --set data.max_len=0", "data.max_len"),
    # empty data: the line that says so stands alone (no data summary before it, no usage box)
    (
        "train-empty-train-file",
        "train -c {cfg} --set data.train_src={empty}",
        "{empty}: the training file holds no text",
    ),
    (
        "train-blank-train-file",
        "train -c {cfg} --set data.train_tgt={blank}",
        "{blank}: the training file holds no text",
    ),
    (
        "train-empty-validation",
        "train -c {cfg} --set data.valid_src={empty} --set data.valid_tgt={empty}",
        "{empty}: the validation file holds no text",
    ),
    (
        "pre-empty-train-file",
        "preprocess -c {cfg} --set data.train_src={empty}",
        "{empty}: the training file holds no text",
    ),
    ("unknown-command", "nope", "no such command 'nope'"),
    ("unknown-option", "bleu -r {ref} {ref} --nope", "no such option: --nope"),
    ("missing-option", "bleu {ref}", "missing option '--ref'"),
]


@pytest.fixture(scope="module")
def bad_inputs(corpus_slice, spm_model, tmp_path_factory) -> dict[str, str]:
    from tests.conftest import make_checkpoint

    root = tmp_path_factory.mktemp("bad_inputs")
    bad = root / "bad.en"
    bad.write_bytes(b"Ein Hund.\n" + "Zwei Kätzchen.\n".encode("latin-1"))
    cfg = write(
        root / "c.yaml",
        f"data:\n  train_src: {corpus_slice['train.en']}\n  train_tgt: {corpus_slice['train.de']}\n"
        f"tokenizer:\n  model: {spm_model}\nmodel:\n  d_model: 16\n  heads: 2\n  d_ff: 16\n  encoder_layers: 1\n"
        f"  decoder_layers: 1\ntrain:\n  out_dir: {root / 'run'}\n  max_updates: 1\n  device: cpu\n",
    )  # tiny, should a row train
    os.mkfifo(root / "fifo")
    return {
        "ckpt": str(make_checkpoint(spm_model, root / "a.pt")),
        "ckpt2": str(make_checkpoint(spm_model, root / "b.pt", seed=1)),
        "spm": str(spm_model),
        "src": str(corpus_slice["val.en"]),
        "ref": str(corpus_slice["val.de"]),
        "long_ref": str(corpus_slice["train.de"]),
        "bad_utf8": str(bad),
        "cfg": str(cfg),
        "fifo": str(root / "fifo"),
        "dup_cfg": str(write(root / "dup.yaml", "train:\n  lr: 0.001\n  lr: 0.002\n")),
        "empty": str(write(root / "empty.txt", "")),
        "blank": str(write(root / "blank.txt", "\n \n\n")),
        "tmp": str(root / "scratch"),
    }


def test_the_table_is_large_enough():
    assert len(BAD_COMMANDS) >= 40 and len({name for name, _, _ in BAD_COMMANDS}) == len(BAD_COMMANDS)


@pytest.mark.parametrize("name, argv, names", BAD_COMMANDS, ids=[row[0] for row in BAD_COMMANDS])
def test_bad_command_line_is_one_clear_error(name, argv, names, bad_inputs, capsys):
    Path(bad_inputs["tmp"]).mkdir(exist_ok=True)
    before = {
        p: Path(p).read_bytes() for p in (bad_inputs["src"], bad_inputs["ref"], bad_inputs["ckpt2"], bad_inputs["spm"])
    }
    with pytest.raises(SystemExit) as exc:
        main([arg.format(**bad_inputs) for arg in argv.split()])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("tmt: error: ") and not out, out + err  # the one line, alone
    assert names.format(**bad_inputs) in err, err
    assert {p: Path(p).read_bytes() for p in before} == before  # no input was touched


# ---------------------------------------------------------------- item 10: a full disk is one line naming the file
def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_output_names_the_file_and_keeps_its_bytes(tmp_path, bad_inputs, monkeypatch, capsys):
    from transformer_mt.text import textio

    out = write(tmp_path / "out.txt", "yesterday's results\n")
    monkeypatch.setattr(textio.os, "fsync", enospc)  # the disk fills up as the new output is completed
    code, err = run_cli(["tokenize", "encode", "-m", bad_inputs["spm"], bad_inputs["src"], "-o", str(out)], capsys)
    assert code == 2 and err == f"tmt: error: {out}: No space left on device; free some disk space or write elsewhere\n"
    assert out.read_bytes() == b"yesterday's results\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full")
def test_writing_to_dev_full_names_it(bad_inputs, capsys):
    code, err = run_cli(["translate", "-c", bad_inputs["ckpt"], bad_inputs["src"], "-o", "/dev/full"], capsys)
    assert code == 2 and err.startswith("tmt: error: /dev/full: No space left on device") and err.count("\n") == 1, err
    assert Path("/dev/full").is_char_device()  # written to, never replaced


def test_disk_full_on_stdout_names_stdout(bad_inputs, monkeypatch, capsys):
    class FullStdout(io.StringIO):
        write = flush = enospc

    monkeypatch.setattr(sys, "stdout", FullStdout())
    code, err = run_cli(["bleu", "-r", bad_inputs["ref"], bad_inputs["ref"]], capsys)
    assert code == 2 and err.startswith("tmt: error: <stdout>: No space left on device") and err.count("\n") == 1, err


def test_disk_full_while_writing_the_cache_is_one_line(tmp_path, bad_inputs, monkeypatch, capsys):
    from transformer_mt.data import encoded as encoded_module

    def numpy_full(*_args, **_kwargs):  # what ndarray.tofile raises on a full disk: no errno, no file name
        raise OSError("40000 requested and 0 written")

    monkeypatch.setattr(encoded_module.CacheWriter, "add", numpy_full)
    cache = tmp_path / "cache"
    code, err = run_cli(["preprocess", "-c", bad_inputs["cfg"], "--set", f"data.cache_dir={cache}"], capsys)
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


# ---------------------------------------------------------------- item 9: a beam is checked against the vocabulary first
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
    code, err = run_cli(["translate", "-c", bad_inputs["ckpt"], "--lenpen", lenpen, bad_inputs["src"]], capsys)
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
    code, err = run_cli(["serve", "-c", "no-such.pt", *args], capsys)
    assert code == 2 and err.startswith(f"tmt: error: {words}") and err.count("\n") == 1


def test_mbr_superscript_index_is_one_line(tmp_path, capsys):
    nbest = write(tmp_path / "nbest.txt", "0\t-1.0\tein Hund\n\u00b2\t-2.0\tzwei Hunde\n")
    code, err = run_cli(["mbr", str(nbest)], capsys)
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
    code, err = run_cli(["translate", "-c", ckpt, bad_inputs["src"]], capsys)
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
    code, err = run_cli(["translate", "-c", ckpt, bad_inputs["src"]], capsys)
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
    code, err = run_cli(["translate", "-c", bad_inputs["ckpt"], "/dev/null"], capsys)
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
    code, err = run_cli(["translate", "-c", bad_inputs["ckpt"], str(fifo), "-o", str(out)], capsys)
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
    code, err = run_cli(["translate", "-c", bad_inputs["ckpt"], str(tmp_path)], capsys)
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
