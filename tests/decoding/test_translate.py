"""`tmt translate`, `tmt evaluate`, `tmt bleu` and `tmt average` through the public entry point."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, pack_tokenizers, save_checkpoint
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
    requests = [
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
    assert tr.max_src_tokens == 63 and tr.positions == 70 and tr.model.pe.size(0) == 70
    with pytest.raises(TranslateError, match="max_len_b=50"):
        tr.translate_batch(["A man rides a horse."], beam=1, lenpen=0.6, max_len_b=50)
    assert (
        tr.translate_batch(["A man rides a horse."], beam=1, lenpen=0.6, max_len_b=2).hypotheses[0][0][1] != ""
    )  # within the table
    with pytest.raises(ValueError, match="reserve_positions"):  # the model itself never grows the table while decoding
        tr.model.encode(torch.full((1, 71), 5))
    assert tr.model.pe.size(0) == 70


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
    try:
        for sentence in ("A man rides a horse.", "", "Two dogs play in the park."):
            proc.stdin.write(sentence + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no output line before the next input line"
            answer = proc.stdout.readline()
            assert answer.endswith("\n") and (answer == "\n") == (sentence == "")
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_evaluate_reports_scores_and_speed(ckpt, corpus_slice, tmp_path, capsys):
    hyp = tmp_path / "val.hyp"
    code, out, _ = run_cli(
        [
            "evaluate",
            "-c",
            str(ckpt),
            "--src",
            str(corpus_slice["val.en"]),
            "--ref",
            str(corpus_slice["val.de"]),
            "-o",
            str(hyp),
            "--beam",
            "2",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    report = json.loads(out)
    assert set(report) >= {"bleu", "chrf", "sentences_per_s", "tgt_tokens_per_s", "bleu_signature"}
    assert report["sentences_per_s"] > 0 and len(hyp.read_text().splitlines()) == 100
    # the printed BLEU is the BLEU of the written file
    code, out, _ = run_cli(["bleu", "--ref", str(corpus_slice["val.de"]), str(hyp), "--json", "-w", "2"], capsys)
    assert json.loads(out)[0]["score"] == report["bleu"]


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


def _sacrebleu(*args: str) -> str:
    return subprocess.run([str(VENV_BIN / "sacrebleu"), *args], capture_output=True, text=True, check=True).stdout


def test_bleu_matches_sacrebleu_command_line(multi30k, tmp_path, capsys):
    ref = multi30k / "test_2016_flickr.de"
    # a deterministic imperfect hypothesis: every 5th word dropped, every 9th line reversed
    hyp_lines = []
    for i, line in enumerate(head(ref, 1000)):
        words = [w for k, w in enumerate(line.split()) if k % 5 != 4]
        hyp_lines.append(" ".join(reversed(words) if i % 9 == 0 else words))
    hyp = tmp_path / "hyp.de"
    hyp.write_text("\n".join(hyp_lines) + "\n", encoding="utf-8")
    for extra in ([], ["-lc"]):
        code, out, _ = run_cli(["bleu", "--ref", str(ref), str(hyp), "--json", "-w", "2", *extra], capsys)
        ours = json.loads(out)
        theirs = json.loads(
            _sacrebleu(
                str(ref),
                "-i",
                str(hyp),
                "-m",
                "bleu",
                "chrf",
                "-w",
                "2",
                "--format",
                "json",
                *(["-lc", "--chrf-lowercase"] if extra else []),
            )
        )
        assert [(o["name"], o["score"], o["signature"]) for o in ours] == [
            (t["name"], t["score"], t["signature"]) for t in theirs
        ]
    code, out, _ = run_cli(["bleu", "--ref", str(ref), str(hyp)], capsys)
    assert out.strip() == _sacrebleu(str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "--format", "text").strip()
    short = tmp_path / "short.de"
    short.write_text("\n".join(hyp_lines[:10]) + "\n")
    code, _, err = run_cli(["bleu", "--ref", str(ref), str(short)], capsys)
    assert code == 2 and "10" in err and "1000" in err and err.count("\n") == 1


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


# ---------------------------------------------------------------- checkpoints nobody here wrote: checked before anything is allocated
def crafted(base: Path, path: Path, change) -> Path:
    """A copy of checkpoint `base` with `change(state)` applied, saved at `path`."""
    state = load_checkpoint(base)
    change(state)
    save_checkpoint(state, path)
    return path


def refused_line(path: Path, capsys) -> str:
    """`tmt translate -c PATH` under a 1.5 GiB address-space cap: the one `tmt: error:` line it must print, exit 2."""
    from tests.hostile import address_space_limit

    source = path.parent / "source.txt"
    source.write_text("A man rides a horse.\n", encoding="utf-8")
    with address_space_limit():
        code, out, err = run_cli(["translate", source, "-c", path, "--device", "cpu"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("tmt: error: ") and "Traceback" not in err, err[-3000:]
    assert str(path) in err and len(err) <= 600, err
    return err


def test_checkpoint_asking_for_more_than_its_bytes_is_refused_before_allocating(ckpt, tmp_path, capsys):
    # 3.3e10 parameters (123 GiB) under the old bound of 1e11; the file holds a model of 0.2 MB
    path = crafted(
        ckpt,
        tmp_path / "huge.pt",
        lambda s: s["config"]["model"].update(d_model=65536, d_ff=65536, heads=1, max_positions=64),
    )
    err = refused_line(path, capsys)
    assert "parameters" in err

    # within the parameter bound, and every tensor of the right shape, but all of them views of one storage:
    # the model needs 6.3M numbers (25 MB), the file holds 1M (4 MB)
    def one_storage(state):
        state["config"]["model"].update(d_model=512, heads=8, d_ff=1024)
        with torch.device("meta"):
            model = Transformer(config_from_checkpoint(state).model, src_vocab_size=1000, tgt_vocab_size=1000)
        shapes = {name: t.shape for name, t in model.state_dict().items()}
        storage = torch.zeros(max(shape.numel() for shape in shapes.values()))
        state["model"] = {name: storage[: shape.numel()].view(shape) for name, shape in shapes.items()}

    path = crafted(ckpt, tmp_path / "shared.pt", one_storage)
    err = refused_line(path, capsys)
    assert "bytes" in err


def test_parameter_bound_counts_the_tokenizers_real_vocabulary(ckpt, tmp_path, capsys, monkeypatch):
    from transformer_mt.config import checks

    # The config says 8 pieces, the tokenizer it holds has 1000: the bound must count 1000 rows per table.
    path = crafted(ckpt, tmp_path / "vocab.pt", lambda s: s["config"]["tokenizer"].update(vocab_size=8))
    monkeypatch.setattr(
        checks, "MAX_PARAMETERS", 40_000
    )  # the model holds 55,424 numbers with 1000 pieces; 8 would make ~24k
    err = refused_line(path, capsys)
    assert "1,000" in err and "parameters" in err


def test_weights_that_do_not_fit_are_named_one_tensor_with_both_shapes(ckpt, tmp_path, capsys):
    path = crafted(
        ckpt, tmp_path / "shape.pt", lambda s: s["model"].__setitem__("encoder.0.ffn.fc1.weight", torch.zeros(64, 16))
    )
    err = refused_line(path, capsys)
    assert "encoder.0.ffn.fc1.weight" in err and "(64, 16)" in err and "(64, 32)" in err
    path = crafted(
        ckpt, tmp_path / "layers.pt", lambda s: s["config"]["model"].update(encoder_layers=3)
    )  # 24 tensors missing
    err = refused_line(path, capsys)
    assert "encoder.1." in err and "encoder.2." not in err
    path = crafted(
        ckpt,
        tmp_path / "dtype.pt",
        lambda s: s["model"].__setitem__("encoder.0.ffn.fc1.bias", torch.zeros(64, dtype=torch.int64)),
    )
    err = refused_line(path, capsys)
    assert "encoder.0.ffn.fc1.bias" in err and "int64" in err


def test_a_tensor_viewing_more_numbers_than_it_stores_is_refused(ckpt, tmp_path, capsys):
    # a (1000, 32) embedding whose 32,000 numbers are one float repeated (stride 0): 4 bytes in the file
    one = torch.zeros(1).expand(1000, 32)
    path = crafted(
        ckpt,
        tmp_path / "stride.pt",
        lambda s: s["model"].update({"src_embed.weight": one, "tgt_embed.weight": one, "output_proj.weight": one}),
    )
    err = refused_line(path, capsys)
    assert "src_embed.weight" in err or "tgt_embed.weight" in err or "output_proj.weight" in err


@pytest.mark.parametrize(
    "name, change, names",
    [
        ("ema-decay-only", lambda s: s.__setitem__("ema", {"decay": 0.9}), ["ema"]),
        ("ema-weights-list", lambda s: s.__setitem__("ema", {"decay": 0.9, "updates": 1, "weights": [1]}), ["ema"]),
        (
            "ema-weight-shape",
            lambda s: s.__setitem__(
                "ema", {"decay": 0.9, "updates": 1, "weights": {"src_embed.weight": torch.zeros(3)}}
            ),
            ["src_embed.weight"],
        ),
        ("model-null", lambda s: s["config"].__setitem__("model", None), ["model"]),
        ("model-list", lambda s: s["config"].__setitem__("model", [1, 2]), ["model"]),
        ("key-int", lambda s: s["config"]["model"].__setitem__(5, 1), ["model.5"]),
        ("dropout-str", lambda s: s["config"]["model"].__setitem__("dropout", "x"), ["model.dropout"]),
        ("dropout-null", lambda s: s["config"]["model"].__setitem__("dropout", None), ["model.dropout"]),
        ("heads-zero", lambda s: s["config"]["model"].__setitem__("heads", 0), ["model.heads"]),
        ("layers-bool", lambda s: s["config"]["model"].__setitem__("encoder_layers", True), ["model.encoder_layers"]),
        ("tokenizer-str", lambda s: s["tokenizers"].__setitem__("src", "not a tensor"), ["src"]),
        ("tokenizers-tensor", lambda s: s.__setitem__("tokenizers", torch.zeros(3)), ["tokenizers"]),
        ("weights-str", lambda s: s["model"].__setitem__("src_embed.weight", "x"), ["src_embed.weight"]),
        ("weight-name-int", lambda s: s["model"].__setitem__(7, torch.zeros(1)), ["model"]),
        ("format-tensor", lambda s: s.__setitem__("format", torch.zeros(2, 2)), ["format"]),
        (
            "default-beam-too-wide",
            lambda s: s["config"]["decode"].__setitem__("beam", 600),
            ["decode.beam=600", "at most 499"],
        ),
        (
            "beam-wider-than-kept-pieces",
            lambda s: (
                s["config"]["model"].__setitem__("restrict_output", True),
                s["model"].__setitem__("output_ids", torch.arange(4)),
            ),
            ["decode.beam=3", "at most 1"],
        ),
    ],
)
def test_damaged_checkpoint_entries_are_refused_in_one_line(ckpt, tmp_path, capsys, name, change, names):
    path = tmp_path / f"{name}.pt"
    state = load_checkpoint(ckpt)
    change(state)
    torch.save(state, path)  # as a stranger would write it: save_checkpoint sets the format
    err = refused_line(path, capsys)
    for key in names:
        assert key in err, err
