"""`tmt export --format ctranslate2`: CTranslate2 decodes the exported model exactly as tmt decodes the checkpoint.

Parity settings: float32, lenpen 0 on both sides. tmt's length penalty is GNMT ((5 + len) / 6)^alpha and
CTranslate2's divides by len^alpha, so only alpha = 0 (plain log-probability) means the same thing in
both; with it, CTranslate2's beam search (2 * beam candidates, EOS finishing within the top beam,
early exit once the best candidate is EOS) returns the same best hypothesis as tmt's. tmt's maximum
output length is floor(a * n + b) per sentence (n = pieces + EOS); CTranslate2 takes one
max_decoding_length per call, so each sentence is decoded by its own call with its own limit.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.checkpoint import (
    config_from_checkpoint,
    load_checkpoint,
    pack_tokenizers,
    save_checkpoint,
    unpack_tokenizers,
)
from transformer_mt.cli.formats import FormatError, exporter
from transformer_mt.config import load_config, to_dict
from transformer_mt.data import source_tensor
from transformer_mt.decoding import Translator, translate_ids
from transformer_mt.export import ExportError, export
from transformer_mt.model import Transformer
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_sentencepiece

ctranslate2 = pytest.importorskip("ctranslate2")


def _ct2_decode(ct, pieces: list[list[str]], *, beam: int, max_len_a: float, max_len_b: int, limit: int | None = None):
    """CTranslate2 best hypothesis (pieces, score) per sentence, each with tmt's maximum length for it."""
    out = []
    for p in pieces:
        max_len = math.floor(max_len_a * (len(p) + 1) + max_len_b)
        res = ct.translate_batch(
            [p],
            beam_size=beam,
            length_penalty=0.0,
            max_decoding_length=min(max_len, limit or max_len),
            return_scores=True,
        )[0]
        out.append((res.hypotheses[0], res.scores[0]))
    return out


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_ctranslate2_matches_tmt_token_for_token(norm, tiny_checkpoint, tiny_checkpoint_postnorm, multi30k, tmp_path):
    ckpt = tiny_checkpoint if norm == "pre" else tiny_checkpoint_postnorm
    out = export(ckpt, tmp_path / "ct2")
    lines = head(multi30k / "test_2016_flickr.en", 50)
    tr = Translator.from_checkpoint(ckpt, device="cpu")
    assert tr.cfg.model.norm == norm
    d = tr.cfg.decode
    ct = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    src_ids = tr.src_tok.encode(lines)
    pieces = tr.src_tok.encode_pieces(lines)
    for beam in (1, 4):
        ours = translate_ids(tr.model, src_ids, beam=beam, lenpen=0.0, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        theirs = _ct2_decode(ct, pieces, beam=beam, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        for i, (nbest, (hyp, score)) in enumerate(zip(ours, theirs)):
            assert [tr.tgt_tok.sp.piece_to_id(p) for p in hyp] == nbest[0].tokens, (beam, i, lines[i])
            # lenpen 0: the summed log-prob, EOS included. CTranslate2's search reports it up to ~3e-3 above the
            # sum of its own score_batch log-probs (which equal tmt's to ~1e-5): a different kernel, same tokens.
            assert score == pytest.approx(nbest[0].logprob, abs=5e-3), (beam, i)
        texts = [nb[0][1] for nb in tr.translate_batch(lines, beam=beam, lenpen=0.0).hypotheses]
        assert texts == tr.tgt_tok.decode_pieces(
            [h for h, _ in theirs]
        )  # and `tmt translate`'s text is CTranslate2's, detokenized
        assert len(set(texts)) > 25  # a model that says varied things, not one string 50 times


def _random_checkpoint(path, src_tok, tgt_tok, *overrides) -> None:
    """An untrained model saved as a tmt checkpoint: the weights need not be good to be converted exactly."""
    cfg = load_config(None, ["data.max_len=30", "tokenizer.joint=false", *overrides], check_files=False)
    torch.manual_seed(0)
    model = Transformer(cfg.model, src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size)
    save_checkpoint(
        {
            "model": model.state_dict(),
            "config": to_dict(cfg),
            "tokenizers": pack_tokenizers(src_tok.proto, tgt_tok.proto),
        },
        path,
    )


@pytest.fixture(scope="module")
def separate_tokenizers(corpus_slice, tmp_path_factory):
    root = tmp_path_factory.mktemp("spm_sep")
    return (
        Tokenizer(train_sentencepiece([corpus_slice["train.en"]], root / "en", vocab_size=500)),
        Tokenizer(train_sentencepiece([corpus_slice["train.de"]], root / "de", vocab_size=600)),
    )


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_learned_positions_separate_vocabularies_teacher_forced(norm, separate_tokenizers, corpus_slice, tmp_path):
    """Learned positions up to the last row of their table, separate source and target vocabularies
    (no tied embeddings), GELU and a non-default head size: CTranslate2's per-token log-probabilities
    of reference translations equal tmt's teacher-forced ones (an untrained model: its near-uniform
    distributions make search outputs differ on float ties, the log-probs do not)."""
    src_tok, tgt_tok = separate_tokenizers
    ckpt = tmp_path / "rand.pt"
    _random_checkpoint(
        ckpt,
        src_tok,
        tgt_tok,
        "model.encoder_layers=2",
        "model.decoder_layers=1",
        "model.d_model=24",
        "model.heads=2",
        "model.head_dim=8",
        "model.value_dim=8",
        "model.d_ff=40",
        "model.activation=gelu",
        "model.positions=learned",
        "model.max_positions=40",
        "model.share_all_embeddings=false",
        "model.share_decoder_embeddings=false",
        f"model.norm={norm}",
    )
    out = export(ckpt, tmp_path / "ct2")
    assert {"source.model", "target.model", "source_vocabulary.json", "target_vocabulary.json"} <= {
        p.name for p in out.iterdir()
    }
    assert json.loads((out / "target_vocabulary.json").read_text(encoding="utf-8")) == [
        tgt_tok.sp.id_to_piece(i) for i in range(600)
    ]
    state = load_checkpoint(ckpt)
    model = Transformer(config_from_checkpoint(state).model, src_vocab_size=500, tgt_vocab_size=600).eval()
    model.load_state_dict(state["model"])
    src_lines, tgt_lines = head(corpus_slice["val.en"], 20), head(corpus_slice["val.de"], 20)
    # Sources longer than the model takes are truncated as tmt truncates them (39 pieces + EOS) by the export's
    # max_input_length; targets BOS + 38 pieces + EOS: the 40-row table's last row is used on both sides.
    src_pieces = src_tok.encode_pieces(src_lines)
    tgt_pieces = [p[:38] for p in tgt_tok.encode_pieces(tgt_lines)]
    assert max(map(len, src_pieces)) > 39 and max(map(len, tgt_pieces)) == 38
    ct = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    max_input = json.loads((out / "tmt_export.json").read_text(encoding="utf-8"))["max_input_length"]
    scored = ct.score_batch(src_pieces, tgt_pieces, max_input_length=max_input)
    for sp, tp, res in zip(src_pieces, tgt_pieces, scored):
        src = source_tensor([src_tok.sp.piece_to_id(sp[:39])])
        tgt = tgt_tok.sp.piece_to_id(tp)
        with torch.inference_mode():
            lprobs = torch.log_softmax(model.decode(torch.tensor([[BOS_ID] + tgt]), model.encode(src)), dim=-1)[
                0
            ]  # (T, V)
        ours = lprobs[torch.arange(len(tgt) + 1), torch.tensor(tgt + [EOS_ID])]
        assert torch.tensor(res.log_probs) == pytest.approx(ours, abs=1e-4)


def test_special_tokens_and_files(tiny_checkpoint, tmp_path):
    out = export(tiny_checkpoint, tmp_path / "ct2")
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    # tmt: source = pieces + EOS, decoder input starts with BOS, ids pad 0, unk 1, bos 2, eos 3.
    assert (config["add_source_eos"], config["add_source_bos"], config["decoder_start_token"]) == (True, False, "<s>")
    assert (config["unk_token"], config["bos_token"], config["eos_token"]) == ("<unk>", "<s>", "</s>")
    vocab = json.loads((out / "shared_vocabulary.json").read_text(encoding="utf-8"))  # one joint vocabulary, saved once
    assert [vocab[i] for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (out / "sentencepiece.model").read_bytes() == unpack_tokenizers(load_checkpoint(tiny_checkpoint))[0]
    notes = json.loads((out / "tmt_export.json").read_text(encoding="utf-8"))
    assert notes["quantization"] == "float32" and notes["sentencepiece"] == ["sentencepiece.model"]
    assert notes["max_input_length"] == 1024  # the model's max_positions: 1023 pieces + the EOS CTranslate2 appends


def test_int8_export_quantizes_the_weight_matrices(tiny_checkpoint, multi30k, tmp_path):
    f32 = export(tiny_checkpoint, tmp_path / "f32")
    int8 = export(tiny_checkpoint, tmp_path / "int8", quantization="int8")
    # Every weight matrix (embeddings and linear layers; a tied matrix once) drops from 4 bytes per value to 1
    # plus one float32 scale per row; position tables, biases and norms stay float32.
    weights = {t.data_ptr(): t for t in load_checkpoint(tiny_checkpoint)["model"].values() if t.dim() == 2}
    saved = sum(3 * t.numel() - 4 * t.size(0) for t in weights.values())
    assert (f32 / "model.bin").stat().st_size - (int8 / "model.bin").stat().st_size == pytest.approx(saved, rel=0.02)
    tok = Tokenizer(int8 / "sentencepiece.model")
    ct = ctranslate2.Translator(str(int8), device="cpu", compute_type="int8")
    res = ct.translate_batch(tok.encode_pieces(head(multi30k / "test_2016_flickr.en", 5)), beam_size=4)
    assert all(r.hypotheses[0] for r in res)


def test_export_errors(tiny_checkpoint, tmp_path):
    export(tiny_checkpoint, tmp_path / "out")
    with pytest.raises(ExportError, match="already exists.*--force"):
        export(tiny_checkpoint, tmp_path / "out")
    export(tiny_checkpoint, tmp_path / "out", force=True)
    with pytest.raises(ExportError, match="--quantization 'int3' is not one of"):
        export(tiny_checkpoint, tmp_path / "q", quantization="int3")
    with pytest.raises(FormatError, match="--format 'onnx' is not supported"):  # the formats' registry
        exporter("onnx")


def test_cli_export_and_missing_extra(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import transformer_mt.cli.deploy  # noqa: F401 - registers the command
    from transformer_mt.cli import main

    def run(argv):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        cap = capsys.readouterr()
        return exit_.value.code or 0, cap.out, cap.err

    code, out, _ = run(["export", "-c", str(tiny_checkpoint), "-o", str(tmp_path / "m"), "-q", "int8"])
    assert code == 0 and "int8" in out and (tmp_path / "m" / "model.bin").is_file()
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # what `import ctranslate2` meets without the extra
    code, _, err = run(["export", "-c", str(tiny_checkpoint), "-o", str(tmp_path / "m2")])
    assert code == 2 and err.strip() == 'tmt: error: ctranslate2 is not installed; run: pip install -e ".[export]"'
    assert not (tmp_path / "m2").exists()


def test_benchmark_ctranslate2_phase(tiny_checkpoint, multi30k, tmp_path):
    """scripts/benchmark.py --ctranslate2's phase: CTranslate2 float32 / int8 called directly, tmt's engine over it, and
    tmt's own search, on the same lines; the rows count what they say."""
    import shutil

    from transformer_mt.benchmark import best_pass, phase_ctranslate2

    ckpt = tmp_path / "tiny.pt"  # the engine caches its conversion beside the checkpoint
    shutil.copy(tiny_checkpoint, ckpt)
    res = phase_ctranslate2(
        {
            "checkpoint": str(ckpt),
            "input": str(multi30k / "test_2016_flickr.en"),
            "sentences": 30,
            "beam": 5,
            "threads": 1,
            "passes": 1,
            "result": str(tmp_path / "r.json"),
        }
    )
    rows = res["engines"]
    assert (
        list(rows) == ["tmt", "CTranslate2 float32", "CTranslate2 int8", "tmt --engine ctranslate2"]
        and res["sentences"] == 30
    )
    assert (tmp_path / "tiny.pt.ct2" / "model.bin").is_file()
    for e in rows.values():
        assert e["tokens_per_s"] == pytest.approx(e["target_tokens"] / e["seconds"]) and e["target_tokens"] >= 30
        assert e["sentences_per_s"] == pytest.approx(30 / e["seconds"]) and e["latency_p50_ms"] > 0
        assert len(e["passes"]) == 1 and e["seconds"] == e["passes"][0]["seconds"]
    # each row's figures are its best pass: the fastest whole call and the lowest one-line median, which may be two
    # passes
    runs = [
        {"seconds": 2.0, "latency_p50_ms": 5.0, "target_tokens": 9},
        {"seconds": 3.0, "latency_p50_ms": 4.0, "target_tokens": 9},
    ]
    best = best_pass(runs)
    assert (best["seconds"], best["latency_p50_ms"], best["target_tokens"], len(best["passes"])) == (2.0, 4.0, 9, 2)
    # The engine keeps tmt's per-sentence limits: its output is tmt's, token for token, but for the few degenerate lines
    # of this barely trained model where the two beam searches part
    # (test_engine: test_trained_model_equals_translator...).
    assert rows["tmt --engine ctranslate2"]["same_as_tmt"] >= 28 / 30 and rows["tmt"]["same_as_tmt"] == 1.0
    if rows["tmt --engine ctranslate2"]["same_as_tmt"] == 1.0:
        assert rows["tmt --engine ctranslate2"]["target_tokens"] == rows["tmt"]["target_tokens"]
    assert rows["CTranslate2 int8"]["dtype"] == "int8" and 0.0 <= rows["CTranslate2 int8"]["same_as_tmt"] <= 1.0


@pytest.mark.parametrize("restrict", [False, True])
def test_swish_halves_and_output_bias_teacher_forced(restrict, separate_tokenizers, corpus_slice, tmp_path):
    """The options of a converted MarianMT model, swish, the halves position layout and a (random, non-zero) output
    bias, with and without model.restrict_output: CTranslate2's per-token log-probabilities of reference translations
    equal tmt's teacher-forced ones."""
    src_tok, tgt_tok = separate_tokenizers
    ckpt = tmp_path / "rand.pt"
    options = [
        "model.activation=swish",
        "model.position_layout=halves",
        "model.output_bias=true",
        f"model.restrict_output={str(restrict).lower()}",
    ]
    sizes = [
        "model.encoder_layers=2",
        "model.decoder_layers=2",
        "model.d_model=32",
        "model.heads=4",
        "model.d_ff=48",
        "model.norm=pre",
    ]
    _random_checkpoint(ckpt, src_tok, tgt_tok, *sizes, *options, "model.share_all_embeddings=false")
    src_lines, tgt_lines = head(corpus_slice["val.en"], 20), head(corpus_slice["val.de"], 20)
    src_pieces, tgt_pieces = src_tok.encode_pieces(src_lines), tgt_tok.encode_pieces(tgt_lines)
    tgt_ids = [tgt_tok.sp.piece_to_id(p) for p in tgt_pieces]
    state = load_checkpoint(ckpt)
    state["model"]["output_proj.bias"] = torch.randn(600, generator=torch.Generator().manual_seed(1))
    if restrict:  # the references' pieces and a few others kept: the softmax of both sides runs over them only
        state["model"]["output_ids"] = torch.unique(
            torch.tensor([PAD_ID, UNK_ID, BOS_ID, EOS_ID, *range(100, 140), *(i for t in tgt_ids for i in t)])
        )
    save_checkpoint(state, ckpt)
    model = Transformer(config_from_checkpoint(state).model, src_vocab_size=500, tgt_vocab_size=600).eval()
    model.load_state_dict(state["model"])
    assert model.output_size < 600 if restrict else model.output_ids is None
    out = export(ckpt, tmp_path / "ct2")
    ct = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    for sp, tgt, res in zip(src_pieces, tgt_ids, ct.score_batch(src_pieces, tgt_pieces)):
        with torch.inference_mode():
            lprobs = torch.log_softmax(
                model.decode(torch.tensor([[BOS_ID] + tgt]), model.encode(source_tensor([src_tok.sp.piece_to_id(sp)]))),
                dim=-1,
            )[0]
        ours = lprobs[torch.arange(len(tgt) + 1), torch.tensor(tgt + [EOS_ID])]
        assert torch.tensor(res.log_probs) == pytest.approx(ours, abs=1e-4)


def test_force_replaces_only_an_earlier_export(tiny_checkpoint, tmp_path, capsys):
    import transformer_mt.cli.deploy  # noqa: F401 - registers the command
    from transformer_mt.cli import main

    run = tmp_path / "run"  # a run directory: --force must never delete it
    run.mkdir()
    (run / "checkpoint_best.pt").write_bytes(tiny_checkpoint.read_bytes())
    (run / "notes.txt").write_bytes(b"mine\n")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(ExportError, match=rf"{run}: .*not a directory tmt export wrote"):
        export(tiny_checkpoint, run, force=True)
    with pytest.raises(SystemExit) as exit_:
        main(["export", "-c", str(tiny_checkpoint), "-o", str(run), "--force"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and str(run) in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary left beside it
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ExportError, match="not a directory tmt export wrote"):
        export(tiny_checkpoint, tmp_path / "file", force=True)
    assert (tmp_path / "file").read_bytes() == b"x"
    out = export(tiny_checkpoint, tmp_path / "ct2")
    first = (out / "model.bin").read_bytes()
    export(tiny_checkpoint, out, force=True, quantization="int8")  # an earlier export is replaced whole
    assert (out / "model.bin").read_bytes() != first and json.loads((out / "tmt_export.json").read_text())[
        "quantization"
    ] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "file", "run"]
    assert (export(tiny_checkpoint, tmp_path / "new" / "dir") / "model.bin").is_file()  # missing parents are made


def test_force_keeps_a_file_the_user_changed_after_the_export(spm_model, tmp_path, capsys):
    ckpt = make_checkpoint(spm_model, tmp_path / "m.pt")
    out = tmp_path / "ct2"
    assert run_cli(["export", "-c", ckpt, "-o", out], capsys)[0] == 0
    for name, content in (("model.bin", b"weights the user put here"), ("README.md", b"the user's own notes\n")):
        kept = {p.name: p.read_bytes() for p in out.iterdir()}
        (out / name).write_bytes(content)
        code, stdout, err = run_cli(["export", "-c", ckpt, "-o", out, "--force"], capsys)
        assert code == 2 and stdout == "" and err.count("\n") == 1 and str(out / name) in err, err
        assert (out / name).read_bytes() == content and all(
            (out / n).read_bytes() == b for n, b in kept.items() if n != name
        )
        (out / name).unlink()  # the user moves their file away: nothing of theirs is left to lose
    assert (
        run_cli(["export", "-c", ckpt, "-o", out, "--force"], capsys)[0] == 0
        and (out / "model.bin").stat().st_size > 1000
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "m.pt"]  # no temporary left beside it


def test_the_marker_names_the_checkpoint_without_its_path_and_keeps_no_training_config(spm_model, tmp_path, capsys):
    private = "/home/someone/private"  # what a checkpoint's config says about the machine that trained it
    ckpt = make_checkpoint(spm_model, tmp_path / "m.pt")
    state = load_checkpoint(ckpt)
    state["config"]["data"].update(
        train_src=f"{private}/train.en", train_tgt=f"{private}/train.de", cache_dir=f"{private}/cache"
    )
    state["config"]["tokenizer"]["model"] = f"{private}/spm.model"
    state["config"]["train"].update(out_dir=f"{private}/run", init_from=f"{private}/base.pt")
    save_checkpoint(state, ckpt)
    out = tmp_path / "ct2"
    code, _, err = run_cli(["export", "-c", ckpt.resolve(), "-o", out], capsys)
    assert code == 0, err
    notes = json.loads((out / "tmt_export.json").read_text(encoding="utf-8"))
    assert notes["checkpoint"] == "m.pt"
    for path in out.iterdir():
        assert private.encode() not in path.read_bytes() and str(tmp_path).encode() not in path.read_bytes(), path.name
