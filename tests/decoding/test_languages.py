"""The target language of a multilingual model: `Translator.translate(..., tgt_lang=)`, `tmt translate --tgt-lang`,
`tmt evaluate --tgt-lang`, `tmt inspect`'s list, and the refusals, one line each.

The expectation is computed apart from the Translator: sentencepiece's own id of the tag put in front of
sentencepiece's own ids of the line, decoded by ``translate_ids``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from tests.text.multilingual import multilingual_checkpoint
from transformer_mt.decoding import LanguageTranslator, Translator, translate_ids
from transformer_mt.errors import TmtError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def multi(multi30k, tmp_path_factory) -> Path:
    return multilingual_checkpoint(multi30k, tmp_path_factory.mktemp("multi"))


@pytest.fixture(scope="module")
def lines(multi30k) -> list[str]:
    return [*head(multi30k / "val.en", 6), "", "  "]


def expected(tr: Translator, lines: list[str], lang: str) -> list[list[tuple[float, str]]]:
    """2-best (score, text) of beam 2 from sentencepiece's ids of "<2lang>" then the line, blank lines empty."""
    sp = tr.src_tok.sp
    tag = sp.piece_to_id(f"<2{lang}>")
    assert sp.id_to_piece(tag) == f"<2{lang}>"
    kept = [line for line in lines if line.strip()]
    hyps = iter(
        translate_ids(tr.model, [[tag, *sp.encode(line)] for line in kept], beam=2, nbest=2, max_len_a=0, max_len_b=6)
    )
    out = []
    for line in lines:
        nb = next(hyps) if line.strip() else []
        out.append(
            [(h.score, text) for h, text in zip(nb, tr.tgt_tok.decode([h.tokens for h in nb]))] or [(0.0, "")] * 2
        )
    return out


def test_a_multilingual_model_translates_into_the_language_asked_for(multi, lines):
    tr = Translator.from_checkpoint(multi, device="cpu")
    assert tr.languages == ["de", "fr"]
    tr.cfg.decode = dataclasses.replace(tr.cfg.decode, max_len_a=0.0, max_len_b=6)
    outputs = {lang: tr.translate(lines, beam=2, nbest=2, tgt_lang=lang) for lang in ("de", "fr")}
    for lang, got in outputs.items():
        want = expected(tr, lines, lang)
        assert [[text for _, text in nb] for nb in got] == [[text for _, text in nb] for nb in want]
        assert [score for nb in got for score, _ in nb] == pytest.approx([score for nb in want for score, _ in nb])
        assert got[-2:] == [[(0.0, "")] * 2] * 2  # blank lines stay blank: no tag alone is translated
    assert outputs["de"] != outputs["fr"]  # the tag reaches the model: the scores differ
    assert tr.translate(lines[0], beam=2, tgt_lang="fr") == outputs["fr"][0][0][1]


def test_wrong_or_missing_languages_are_one_line_errors(multi, spm_model, tmp_path, multi30k):
    tr = Translator.from_checkpoint(multi, device="cpu")
    for lang, words in (
        (None, "is multilingual (target languages de, fr); give the target language with tgt_lang"),
        ("cs", "tgt_lang cs: "),
        ("en_US!", "'en_US!' is not a language code"),
        ("<2fr>", "'<2fr>' is not a language code"),
    ):
        with pytest.raises(TmtError) as info:
            tr.translate(["A man."], tgt_lang=lang)
        assert words in str(info.value) and "\n" not in str(info.value)
    # one target language: optional, and when given it must name that one
    one = Translator.from_checkpoint(multilingual_checkpoint(multi30k, tmp_path / "one", targets=("de",)), device="cpu")
    assert one.languages == ["de"]
    assert one.translate(["A man."], beam=1) == one.translate(["A man."], beam=1, tgt_lang="de")
    with pytest.raises(TmtError, match=r"^tgt_lang fr: .* does not translate into it; its target languages are de$"):
        one.translate(["A man."], tgt_lang="fr")
    # none stated: the model takes none
    plain = Translator.from_checkpoint(make_checkpoint(spm_model, tmp_path / "plain.pt"), device="cpu")
    assert plain.languages == []
    with pytest.raises(TmtError, match=r"^tgt_lang de: .* states no target language"):
        plain.translate(["A man."], tgt_lang="de")
    # a source language is an NLLB model's alone
    with pytest.raises(TmtError, match=r"^src_lang en: .* reads no source language .*; leave it out$"):
        tr.translate(["A man."], tgt_lang="fr", src_lang="en")


def test_a_checkpoint_whose_tokenizer_lacks_a_language_tag_is_refused_when_loaded(multi, spm_model, tmp_path):
    from transformer_mt.checkpoint import load_checkpoint, pack_tokenizers, save_checkpoint
    from transformer_mt.text import Tokenizer

    state = load_checkpoint(multi)
    state["tokenizers"] = pack_tokenizers(Tokenizer(spm_model).proto)  # no <2de>, no <2fr>
    state["model"] = make_state(state, Tokenizer(spm_model).vocab_size)
    save_checkpoint(state, tmp_path / "untagged.pt")
    with pytest.raises(TmtError) as info:
        Translator.from_checkpoint(tmp_path / "untagged.pt", device="cpu")
    message = str(info.value)
    assert "untagged.pt: the tokenizer has no piece <2de> and would split it" in message and "\n" not in message


def make_state(state: dict, vocab: int) -> dict:
    """The checkpoint's architecture with random weights for a ``vocab``-piece tokenizer."""
    from transformer_mt.config import from_dict
    from transformer_mt.model import Transformer

    torch.manual_seed(0)
    return Transformer(from_dict(state["config"]).model, src_vocab_size=vocab, tgt_vocab_size=vocab).state_dict()


def test_tmt_translate_and_evaluate_take_tgt_lang(multi, lines, tmp_path, capsys):
    src = tmp_path / "src.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tr = Translator.from_checkpoint(multi, device="cpu")
    want = tr.translate(lines, beam=1, tgt_lang="fr")
    code, out, err = run_cli(["translate", "-c", multi, "--tgt-lang", "fr", "--beam", "1", src], capsys)
    assert code == 0, err
    assert out.splitlines() == want
    # evaluate translates the same way (its hypotheses file), scored against the French references
    ref = tmp_path / "ref.fr"
    ref.write_text("\n".join(want) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.fr"
    code, out, err = run_cli(
        ["evaluate", "-c", multi, "--src", src, "--ref", ref, "--tgt-lang", "fr", "--beam", "1", "-o", hyp], capsys
    )
    assert code == 0, err
    assert hyp.read_text(encoding="utf-8").splitlines() == want
    # the refusals: exit 2, one line, before any input is read (stdin is not touched)
    for args, words in (
        ([], "is multilingual (target languages de, fr); give the target language with --tgt-lang, e.g. --tgt-lang de"),
        (["--tgt-lang", "cs"], "--tgt-lang cs: "),
        (["--tgt-lang", "x y"], "--tgt-lang: 'x y' is not a language code"),
        (["--tgt-lang", "fr", "--src-lang", "en"], "--src-lang en: "),  # only an NLLB model reads one
    ):
        for command in (["translate", "-c", multi, *args, src], ["evaluate", "-c", multi, "--src", src, "--ref", ref]):
            code, out, err = run_cli([*command, *args] if command[0] == "evaluate" else command, capsys)
            assert code == 2 and out == ""
            assert err.startswith("tmt: error: ") and words in err and err.count("\n") == 1, err


def test_language_translator_passes_every_setting_on(multi, lines):
    tr = Translator.from_checkpoint(multi, device="cpu")
    bound = LanguageTranslator(tr, "de", where=str(multi))
    assert (bound.cfg, bound.src_tok, bound.max_src_tokens, bound.num_parameters) == (
        tr.cfg,
        tr.src_tok,
        tr.max_src_tokens,
        tr.num_parameters,
    )
    got = bound.translate_batch(lines, beam=2, lenpen=0.6, nbest=2, max_output_tokens=3)
    direct = tr.translate_batch(
        [f"<2de> {line}" if line.strip() else line for line in lines], beam=2, lenpen=0.6, nbest=2, max_output_tokens=3
    )
    assert got.hypotheses == direct.hypotheses and got.stats.truncated == direct.stats.truncated


def test_tmt_inspect_lists_a_checkpoints_languages(multi, spm_model, tmp_path, capsys):
    code, out, _ = run_cli(["inspect", multi], capsys)
    assert code == 0
    assert "target languages: de, fr (multilingual: --tgt-lang picks one; sources start with <2de>, <2fr>)" in out
    code, out, _ = run_cli(["inspect", make_checkpoint(spm_model, tmp_path / "plain.pt")], capsys)
    assert code == 0 and "target languages" not in out


def test_the_ctranslate2_engine_takes_tgt_lang_too(multi, lines, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    import shutil

    ckpt = tmp_path / "multi.pt"  # its conversion is cached beside it: a copy of its own
    shutil.copy(multi, ckpt)
    src = tmp_path / "src.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = {}
    for engine in ("tmt", "ctranslate2"):
        code, out, err = run_cli(
            ["translate", "-c", ckpt, "--engine", engine, "--tgt-lang", "fr", "--beam", "1", src], capsys
        )
        assert code == 0, err
        outputs[engine] = out.splitlines()
    assert outputs["ctranslate2"] == outputs["tmt"]  # greedy: the same tokens, tag included
    code, _, err = run_cli(["translate", "-c", ckpt, "--engine", "ctranslate2", src], capsys)
    assert code == 2 and "is multilingual" in err and err.count("\n") == 1
