"""`tmt export --format marian-hf`: transformers loads the directory with no custom code and decodes as tmt does.

The trained tiny post-norm model of tests/conftest.py has the paper's interleaved sinusoids, so the export permutes
its residual stream into MarianMT's halves order; equal outputs on 50 real lines show the permutation is exact.
Search settings as in test_import.py: length penalty 0 in both (transformers' len**lp and tmt's GNMT
((5+len)/6)**alpha are both the plain sum at 0), no forced EOS, PAD / BOS / the decoder start never generated.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from tests.hf.conftest import transformers
from transformer_mt.decoding import Translator, translate_ids

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def exported(tiny_checkpoint_postnorm, tmp_path_factory):
    from transformer_mt.hf import export_marian

    out = export_marian(tiny_checkpoint_postnorm, tmp_path_factory.mktemp("marian_export") / "hf")
    tr = Translator.from_checkpoint(tiny_checkpoint_postnorm, device="cpu")
    assert tr.cfg.model.norm == "post" and tr.cfg.model.position_layout == "interleaved"
    return (
        out,
        tr,
        transformers.MarianMTModel.from_pretrained(out).eval(),
        transformers.MarianTokenizer.from_pretrained(out),
    )


@pytest.mark.parametrize("beam", [1, 4])
def test_transformers_decodes_as_tmt_translate(beam, exported, multi30k):
    out, tr, hf, tok = exported
    lines = head(multi30k / "test_2016_flickr.en", 50)
    src_ids = tr.src_tok.encode(lines)
    assert [ids + [tr.cfg.model.eos_id] for ids in src_ids] == tok(lines)[
        "input_ids"
    ]  # MarianTokenizer's ids are tmt's
    d = tr.cfg.decode
    ours = translate_ids(tr.model, src_ids, beam=beam, lenpen=0.0, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    # generate takes one length limit per call: lines are decoded in groups that share tmt's limit floor(a * n + b)
    limits = [math.floor(d.max_len_a * (len(ids) + 1) + d.max_len_b) for ids in src_ids]
    theirs: list[list[int]] = [[] for _ in lines]
    gen_texts = [""] * len(lines)
    eos = hf.config.eos_token_id
    for limit in sorted(set(limits)):
        group = [i for i, n in enumerate(limits) if n == limit]
        batch = tok([lines[i] for i in group], return_tensors="pt", padding=True)
        with torch.inference_mode():
            gen = hf.generate(
                **batch, num_beams=beam, length_penalty=0.0, early_stopping=False, max_new_tokens=limit, do_sample=False
            )
        for i, row, text in zip(group, gen[:, 1:].tolist(), tok.batch_decode(gen, skip_special_tokens=True)):
            theirs[i], gen_texts[i] = (row[: row.index(eos)] if eos in row else row), text
    assert [h[0].tokens for h in ours] == theirs
    assert len({tuple(t) for t in theirs}) > 25  # a model that says varied things
    texts = [nb[0][1] for nb in tr.translate_batch(lines, beam=beam, lenpen=0.0).hypotheses]
    # `tmt translate`'s text is MarianTokenizer's, up to the space a final lone "▁" piece leaves, which MarianTokenizer
    # strips
    assert [t.rstrip() for t in texts] == [g.rstrip() for g in gen_texts]


def test_directory_holds_what_transformers_reads(exported):
    out, tr, hf, _ = exported
    names = {p.name for p in out.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "source.spm",
        "target.spm",
        "vocab.json",
        "tokenizer_config.json",
        "tmt_export.json",
    }
    assert hf.config.decoder_start_token_id == tr.cfg.model.start_id == 2 and hf.config.pad_token_id == 0
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["bad_words_ids"] == [[0], [2]] and generation["forced_eos_token_id"] is None
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])] == tr.tgt_tok.pieces()


def test_pre_norm_refused_in_one_line(tiny_checkpoint, tmp_path, capsys):
    code, _, err = run_cli(["export", "-c", tiny_checkpoint, "--format", "marian-hf", "-o", tmp_path / "hf"], capsys)
    assert code == 2 and err.count("\n") == 1 and "model.norm=pre" in err and "post" in err
    assert not (tmp_path / "hf").exists() and not list(tmp_path.iterdir())  # no temporary left behind


def test_force_replaces_only_an_earlier_export(tiny_checkpoint_postnorm, tmp_path, capsys):
    out = tmp_path / "hf"
    assert run_cli(["export", "-c", tiny_checkpoint_postnorm, "--format", "marian-hf", "-o", out], capsys)[0] == 0
    code, _, err = run_cli(["export", "-c", tiny_checkpoint_postnorm, "--format", "marian-hf", "-o", out], capsys)
    assert code == 2 and "--force" in err
    assert (
        run_cli(["export", "-c", tiny_checkpoint_postnorm, "--format", "marian-hf", "-o", out, "--force"], capsys)[0]
        == 0
    )
    other = tmp_path / "run"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, _, err = run_cli(
        ["export", "-c", tiny_checkpoint_postnorm, "--format", "marian-hf", "-o", other, "--force"], capsys
    )
    assert code == 2 and "not a directory tmt export wrote" in err and (other / "notes.txt").read_text() == "mine"
    code, _, err = run_cli(
        ["export", "-c", tiny_checkpoint_postnorm, "--format", "marian-hf", "-o", tmp_path / "q", "-q", "int8"], capsys
    )
    assert code == 2 and "ctranslate2" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]  # no temporary left behind


@pytest.fixture
def random_marian_checkpoint(spm_model, tmp_path):
    """An untrained post-norm model with sinusoidal positions: what marian-hf exports, made in a moment."""
    return make_checkpoint(spm_model, tmp_path / "m.pt", positions="sinusoidal")


def test_force_keeps_the_weights_save_pretrained_wrote_into_the_export(random_marian_checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    assert run_cli(["export", "-c", random_marian_checkpoint, "--format", "marian-hf", "-o", out], capsys)[0] == 0
    model = transformers.MarianMTModel.from_pretrained(out)
    with torch.no_grad():  # a fine-tuning step, in effect
        model.get_encoder().layers[0].fc1.weight.add_(0.01)
    model.save_pretrained(out)
    tuned = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()  # transformers' progress bars
    code, stdout, err = run_cli(
        ["export", "-c", random_marian_checkpoint, "--format", "marian-hf", "-o", out, "--force"], capsys
    )
    assert code == 2 and stdout == "" and err.count("\n") == 1 and f"{out}{os.sep}" in err and "changed" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == tuned


def test_the_directory_follows_the_umask_and_the_marker_names_no_path(random_marian_checkpoint, tmp_path, capsys):
    out, mine = tmp_path / "hf", tmp_path / "mine"
    before = os.umask(0o022)
    try:
        assert (
            run_cli(["export", "-c", random_marian_checkpoint.resolve(), "--format", "marian-hf", "-o", out], capsys)[0]
            == 0
        )
        mine.mkdir()
    finally:
        os.umask(before)
    assert out.stat().st_mode & 0o777 == mine.stat().st_mode & 0o777 == 0o755
    assert json.loads((out / "tmt_export.json").read_text(encoding="utf-8"))["checkpoint"] == "m.pt"
    for path in out.iterdir():
        assert str(tmp_path).encode() not in path.read_bytes(), path.name
