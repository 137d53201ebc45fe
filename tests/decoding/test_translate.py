"""`tmt translate`, `tmt evaluate`, `tmt bleu` and `tmt average` through the public entry point."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.checkpoint import load_checkpoint, pack_tokenizers, save_checkpoint
from transformer_mt.decoding import TranslateError, Translator
from transformer_mt.model import Transformer

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def ckpt(spm_model, tmp_path_factory) -> Path:
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("ckpt") / "model.pt")


def test_one_output_line_per_input_line(ckpt, multi30k, tmp_path, capsys):
    lines = head(multi30k / "test_2016_flickr.en", 6)
    long_line = " ".join(["a dog runs through the snow"] * 30)  # far beyond max_positions=64
    lines = lines[:2] + ["", "   ", long_line] + lines[2:] + ["\t"]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.de"
    code, _, err = run_cli(
        ["translate", "-c", str(ckpt), str(src), "-o", str(out), "--beam", "2", "--device", "cpu"], capsys
    )
    assert code == 0
    result = out.read_text(encoding="utf-8").split("\n")
    assert result[-1] == "" and len(result) - 1 == len(lines)
    assert result[2] == "" and result[3] == "" and result[-2] == ""
    assert all(result[i] for i in (0, 1, 5, 6))  # real sentences get (possibly odd) output
    assert (
        err.strip() == "tmt translate: warning: 1 input line longer than 63 tokens (model.max_positions=64) truncated"
    )


def test_batched_equals_one_at_a_time(ckpt, multi30k):
    tr = Translator.from_checkpoint(ckpt, device="cpu")
    lines = head(multi30k / "val.en", 12)
    for beam in (1, 3):
        batched = tr.translate_batch(lines, beam=beam, lenpen=0.6, batch_tokens=400).hypotheses
        single = [tr.translate_batch([line], beam=beam, lenpen=0.6).hypotheses[0] for line in lines]
        assert [b[0][1] for b in batched] == [s[0][1] for s in single]
        assert [b[0][0] for b in batched] == pytest.approx([s[0][0] for s in single], abs=1e-4)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_threads_sharing_one_translator_get_what_they_get_alone(spm_model, multi30k, tmp_path, positions):
    """Eight requests (different lines, beams and n-best sizes) through one Translator from four threads at
    once: each gets exactly its sequential answer and its own stats, and the model is never changed."""
    tr = Translator.from_checkpoint(make_checkpoint(spm_model, tmp_path / "m.pt", positions=positions), device="cpu")
    lines = head(multi30k / "val.en", 48)
    lines[5] = " ".join(["a dog runs through the snow"] * 30)  # truncated: in request 0's stats only
    requests: list[tuple[list[str], dict[str, Any]]] = [
        (lines[6 * k : 6 * k + 6], {"beam": (1, 3)[k % 2], "nbest": (1, 2, 1, 3)[k % 4], "lenpen": 0.6})
        for k in range(8)
    ]
    params = {name: p.clone() for name, p in tr.model.state_dict().items()}
    pe = getattr(tr.model, "pe", None)
    alone = [tr.translate_batch(text, **kw) for text, kw in requests]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(
            pool.map(lambda req: tr.translate_batch(req[0], **req[1]), requests * 2)
        )  # each request twice, interleaved
    for k, result in enumerate(together):
        assert result.hypotheses == alone[k % 8].hypotheses
        assert result.stats.lines == 6 and result.stats.tgt_tokens == alone[k % 8].stats.tgt_tokens
        assert result.stats.truncated == (k % 8 == 0)
    assert (
        alone[0].stats.warning()
        == "tmt translate: warning: 1 input line longer than 63 tokens (model.max_positions=64) truncated"
    )
    assert alone[1].stats.warning() is None  # a call's stats are its own
    assert getattr(tr.model, "pe", None) is pe  # the position table was sized at load time, never regrown
    assert all(torch.equal(p, params[name]) for name, p in tr.model.state_dict().items()) and not tr.model.training


def test_sinusoid_table_is_sized_at_load_time(spm_model, tmp_path):
    """Longest source accepted (63 pieces + EOS) and longest output the decode settings allow
    (floor(1.0 * 64 + 6) = 70) fit in the table before any translation; decoding past it is refused."""
    tr = Translator.from_checkpoint(make_checkpoint(spm_model, tmp_path / "s.pt", positions="sinusoidal"), device="cpu")
    model = tr.model
    assert isinstance(model, Transformer)  # one checkpoint: no ensemble
    assert tr.max_src_tokens == 63 and tr.positions == 70 and model.pe.size(0) == 70
    with pytest.raises(TranslateError, match="max_len_b=50"):
        tr.translate_batch(["A man rides a horse."], beam=1, lenpen=0.6, max_len_b=50)
    assert (
        tr.translate_batch(["A man rides a horse."], beam=1, lenpen=0.6, max_len_b=2).hypotheses[0][0][1] != ""
    )  # within the table
    with pytest.raises(ValueError, match="reserve_positions"):  # the model itself never grows the table while decoding
        model.encode(torch.full((1, 71), 5))
    assert model.pe.size(0) == 70


def test_nbest_format(ckpt, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("A man rides a horse.\n\nTwo children play.\n", encoding="utf-8")
    code, out, _ = run_cli(["translate", "-c", str(ckpt), str(src), "--beam", "3", "--nbest", "3"], capsys)
    assert code == 0
    rows = [line.split("\t") for line in out.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for i in (0, 2):
        scores = [float(r[1]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True) and len(set(r[2] for r in rows if int(r[0]) == i)) == 3
    assert all(r[2] == "" for r in rows if int(r[0]) == 1)
    code, _, err = run_cli(["translate", "-c", str(ckpt), str(src), "--beam", "2", "--nbest", "3"], capsys)
    assert code == 2 and "1 <= nbest <= beam" in err


def test_stdin_is_translated_as_lines_arrive(ckpt):
    """Interactive use: the answer to line 1 arrives before line 2 is even sent."""
    proc = subprocess.Popen(
        [str(VENV_BIN / "tmt"), "translate", "-c", str(ckpt), "--beam", "1", "--device", "cpu"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None  # both piped
    try:
        for sentence in ("A man rides a horse.", "", "Two dogs play in the park."):
            stdin.write(sentence + "\n")
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], 60)
            assert ready, "no output line before the next input line"
            answer = stdout.readline()
            assert answer.endswith("\n") and (answer == "\n") == (sentence == "")
        stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_ensemble_from_the_command_line(ckpt, spm_model, corpus_slice, tmp_path, capsys):
    src = corpus_slice["val.en"]
    outs = {}
    for name, paths in (
        ("alone", [ckpt]),
        ("twice", [ckpt, ckpt]),
        ("pair", [ckpt, make_checkpoint(spm_model, tmp_path / "other.pt", seed=7)]),
    ):
        outs[name] = tmp_path / f"{name}.de"
        args = [a for p in paths for a in ("-c", str(p))]
        code, _, err = run_cli(["translate", *args, str(src), "-o", str(outs[name]), "--beam", "3"], capsys)
        assert code == 0, err
    text = {name: path.read_text(encoding="utf-8") for name, path in outs.items()}
    assert text["twice"] == text["alone"]  # the mean of one distribution twice is that distribution
    assert text["pair"] != text["alone"] and len(text["pair"].splitlines()) == 100
    # A member with another tokenizer is refused with one line naming it.
    state = load_checkpoint(ckpt)
    src_proto = bytes(state["tokenizers"]["src"].tolist())
    state["tokenizers"] = pack_tokenizers(src_proto, src_proto + b"\n")
    save_checkpoint(state, tmp_path / "alien.pt")
    code, _, err = run_cli(
        ["translate", "-c", str(ckpt), "-c", str(tmp_path / "alien.pt"), str(src), "-o", str(tmp_path / "x.de")], capsys
    )
    assert code == 2
    assert err.strip() == (
        f"tmt: error: {tmp_path / 'alien.pt'}: its sentencepiece models differ from those of {ckpt}; "
        "an ensemble needs checkpoints trained with the same tokenizer"
    )


def test_average_cli_is_the_elementwise_mean(spm_model, tmp_path, capsys):
    a = make_checkpoint(spm_model, tmp_path / "a.pt", seed=1)
    b = make_checkpoint(spm_model, tmp_path / "b.pt", seed=2)
    code, _, _ = run_cli(["average", str(a), str(b), "-o", str(tmp_path / "avg.pt")], capsys)
    assert code == 0
    sa, sb, avg = (load_checkpoint(p)["model"] for p in (a, b, tmp_path / "avg.pt"))
    for key in sa:
        torch.testing.assert_close(avg[key], (sa[key] + sb[key]) / 2)
    other = make_checkpoint(spm_model, tmp_path / "c.pt", d_model=64)
    code, _, err = run_cli(["average", str(a), str(other), "-o", str(tmp_path / "bad.pt")], capsys)
    assert code == 2 and "d_model" in err and not (tmp_path / "bad.pt").exists()
    assert os.path.getsize(tmp_path / "avg.pt") > 0


@pytest.mark.parametrize("beam", [1, 3])
def test_max_output_tokens_caps_each_line_only_where_its_own_limit_is_longer(ckpt, multi30k, beam):
    """A cap of k tokens gives what the search gives with each line's limit at min(a x n + b, k): a line whose own
    limit is shorter decodes as without the cap."""
    tr = Translator.from_checkpoint(ckpt, device="cpu")
    lines = ["A dog.", "Two men.", *head(multi30k / "val.en", 5)]
    cap = 6
    got = tr.translate_batch(lines, beam=beam, lenpen=0.6, max_output_tokens=cap, max_len_a=1.0, max_len_b=0).hypotheses
    own = [len(ids) + 1 for ids in tr.src_tok.encode(lines)]  # max_len_a 1 x (pieces + EOS) + 0
    assert min(own) < cap < max(own)  # both kinds of line are here
    for line, limit, nbest in zip(lines, own, got):
        want = tr.translate_batch([line], beam=beam, lenpen=0.6, max_len_a=0.0, max_len_b=min(limit, cap)).hypotheses[0]
        assert [text for _, text in nbest] == [
            text for _, text in want
        ]  # scores: equal up to the batch's float rounding
        assert [score for score, _ in nbest] == pytest.approx([score for score, _ in want], abs=1e-4)
    with pytest.raises(TranslateError, match="max_output_tokens=0 must be at least 1"):
        tr.translate_batch(lines, beam=beam, lenpen=0.6, max_output_tokens=0)
