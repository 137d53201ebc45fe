"""Tokenizers over several languages: tags as one piece each, the per-language sampling of the tokenizer's input,
and the one-corpus shorthand training exactly the model it always trained."""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from tests.conftest import head
from transformer_mt.config import Config, CorpusConfig, DataConfig, load_config
from transformer_mt.data.prepare import prepare_tokenizers
from transformer_mt.errors import TmtError
from transformer_mt.text import (
    Tokenizer,
    TokenizerError,
    language_tags,
    tagged,
    target_language_tags,
    train_sentencepiece,
)
from transformer_mt.text.spm_input import TEMPERATURE, lines_per_language, sentencepiece_lines

LANGS = ("en", "de", "fr", "cs")
TAGS = ["<2de>", "<2fr>", "<2cs>", "<BT>"]


@pytest.fixture(scope="module")
def four(multi30k, tmp_path_factory) -> dict[str, Path]:
    """The first 500 Multi30k training lines of en, de, fr and cs (line i of each: one image's caption)."""
    root = tmp_path_factory.mktemp("four")
    out = {}
    for lang in LANGS:
        out[lang] = root / f"train.{lang}"
        out[lang].write_text("\n".join(head(multi30k / f"train.{lang}", 500)) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def tagged_tok(four, tmp_path_factory) -> Tokenizer:
    """A joint 600-piece unigram model over the four languages, with the tags as user-defined symbols."""
    prefix = tmp_path_factory.mktemp("tagged_tok") / "spm"
    model = train_sentencepiece(
        [four[lang] for lang in LANGS], prefix, vocab_size=600, user_defined_symbols=TAGS, languages=LANGS
    )
    return Tokenizer(model)


def test_every_tag_is_one_piece_at_the_start_and_inside_and_decodes_back(tagged_tok, four):
    line = head(four["en"], 1)[0]  # "Two young, White males are outside near many bushes."
    plain = tagged_tok.encode([line])[0]
    assert tagged_tok.user_defined_symbols == frozenset(TAGS)
    for tag, tag_id in zip(TAGS, tagged_tok.tag_ids(TAGS, where="test")):
        assert tagged_tok.sp.id_to_piece(tag_id) == tag
        # at the start: the tag's id, then the line's own ids (the ids the data and the Translator prefix)
        assert tagged_tok.encode([f"{tag} {line}"])[0] == [tag_id, *plain]
        assert tagged_tok.encode([f"{tag}{line}"])[0] == [tag_id, *plain]
        assert tagged_tok.encode_pieces([f"{tag} {line}"])[0][0] == tag
        # inside a line: still one piece, never split into "<", "2", "f", "r", ">"
        assert tagged_tok.encode_pieces([f"a {tag} b"])[0].count(tag) == 1
        # decoding keeps it: nothing dropped
        assert tagged_tok.decode([[tag_id, *plain]])[0] == f"{tag} {tagged_tok.decode([plain])[0]}"
    two = tagged_tok.tag_ids(["<2fr>", "<BT>"], where="test")
    assert tagged_tok.encode([f"<2fr> <BT> {line}"])[0] == [*two, *plain]
    # a batch longer than the one-line path, mixing tagged and plain lines: each as alone
    batch = [f"<2cs> {line}", line, "", "<notatag> x"] * 3
    assert tagged_tok.encode(batch) == [tagged_tok.encode([b])[0] for b in batch]
    assert tagged_tok.encode(["<notatag> x"])[0] == tagged_tok.sp.encode("<notatag> x")


def test_a_model_without_tags_encodes_lines_starting_with_a_bracket_as_sentencepiece(spm_model):
    tok = Tokenizer(spm_model)
    lines = ["<2fr> A man.", "<b>bold</b>", "<s> x", "A man."]
    assert tok.user_defined_symbols == frozenset()
    assert tok.encode(lines) == [tok.sp.encode(line) for line in lines]
    assert tok.encode_pieces(lines) == [tok.sp.encode(line, out_type=str) for line in lines]


def test_a_tag_the_tokenizer_would_split_is_one_line_naming_it_and_the_fix(spm_model, corpus_slice, tmp_path):
    with pytest.raises(TokenizerError) as info:
        Tokenizer(spm_model).tag_ids(["<2fr>"], where=str(spm_model))
    message = str(info.value)
    assert "\n" not in message and "<2fr>" in message and str(spm_model) in message
    assert "retrain the tokenizer" in message and "user-defined symbol" in message
    # a run with two target languages and a given tokenizer.model that lacks their tags: refused before training
    cfg = _config(corpus_slice, tmp_path, f"tokenizer.model={spm_model}")
    cfg.data.corpora = [
        CorpusConfig(name="de", src=str(corpus_slice["train.en"]), tgt=str(corpus_slice["train.de"]), tgt_lang="de"),
        CorpusConfig(name="fr", src=str(corpus_slice["train.en"]), tgt=str(corpus_slice["train.de"]), tgt_lang="fr"),
    ]
    with pytest.raises(TokenizerError, match=r"tokenizer.model .*: the tokenizer has no piece <2de> and would split"):
        prepare_tokenizers(cfg, log=lambda _: None)


def test_each_language_gets_at_least_its_stated_share_of_the_tokenizer_input(multi30k, tmp_path):
    sizes = {"en": 2000, "de": 2000, "fr": 200, "cs": 20}
    files = {}
    for lang, n in sizes.items():
        files[lang] = tmp_path / f"train.{lang}"
        files[lang].write_text("\n".join(head(multi30k / f"train.{lang}", n)) + "\n", encoding="utf-8")
    fed = list(sentencepiece_lines([files[lang] for lang in sizes], list(sizes), input_sentence_size=0))
    owner = {line.strip(): lang for lang in sizes for line in head(files[lang], sizes[lang])}
    got = Counter(owner[line] for line in fed)
    budget, largest = sum(sizes.values()), max(sizes.values())
    assert sum(got.values()) == len(fed) == pytest.approx(budget, abs=len(sizes))
    for lang, n in sizes.items():
        # the stated floor: (n / n_max) ** (1/T) / L of the input, T = 5
        assert got[lang] / len(fed) >= (n / largest) ** (1 / TEMPERATURE) / len(sizes)
    assert got["cs"] / len(fed) > 0.09  # its raw share would be 20 / 4220, under 0.5%
    assert got["cs"] > 20 * sizes["cs"] and got["en"] < sizes["en"]  # the small upsampled, the large sampled
    # by the formula itself, computed here: q = n^(1/5) / sum n^(1/5)
    weights = {lang: n**0.2 for lang, n in sizes.items()}
    for lang in sizes:
        assert got[lang] == round(budget * weights[lang] / sum(weights.values()))
    # sentencepiece's input_sentence_size stays the cap: the plan never feeds more
    capped = lines_per_language(sizes, input_sentence_size=1000)
    assert sum(capped.values()) == pytest.approx(1000, abs=len(sizes)) and min(capped.values()) >= 1
    # two languages (a pair) and unstated languages: every line once, in order, as before
    pair = list(sentencepiece_lines([files["en"], files["fr"]], ["en", "fr"], input_sentence_size=0))
    assert pair == [line.strip() for path in (files["en"], files["fr"]) for line in head(path, 10_000) if line.strip()]
    assert list(sentencepiece_lines([files["en"], files["fr"]], [], input_sentence_size=0)) == pair


# the options tmt has always trained its sentencepiece models with (text/tokenizer.py's docstring states the ids)
SHORTHAND_OPTIONS: dict[str, Any] = dict(
    vocab_size=700,
    model_type="unigram",
    character_coverage=1.0,
    input_sentence_size=2_000_000,
    shuffle_input_sentence=True,
    seed_sentencepiece_size=1_000_000,
    pad_id=0,
    unk_id=1,
    bos_id=2,
    eos_id=3,
    pad_piece="<pad>",
    unk_piece="<unk>",
    bos_piece="<s>",
    eos_piece="</s>",
    max_sentence_length=1 << 16,
    minloglevel=2,
)


@pytest.mark.slow  # three tokenizers trained on the 2000-pair slice
def test_the_one_corpus_shorthand_trains_the_same_model_bytes(corpus_slice, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    cfg = _config(corpus_slice, out, "tokenizer.vocab_size=700")
    files = [corpus_slice["train.en"], corpus_slice["train.de"]]
    # the model as sentencepiece trains it on every stripped non-empty line of both files, with tmt's options; the
    # same prefix, since a model records the prefix it was trained under
    lines = [line.strip() for path in files for line in head(path, 100_000) if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(out / "spm"),
        num_threads=os.cpu_count() or 1,
        **SHORTHAND_OPTIONS,
    )
    expected = (out / "spm.model").read_bytes()
    (out / "spm.model").unlink()
    tok, _ = prepare_tokenizers(cfg, log=lambda _: None)
    assert tok.proto == expected
    # its reuse recipe keeps the keys it had, so the models of existing runs are reused, not retrained
    recipe = (out / "spm.json").read_text(encoding="utf-8")
    for key in ("languages", "user_defined_symbols"):
        assert key not in recipe
    # data.corpora naming the same one pair, no languages, no tags: the same model
    (out / "spm.model").unlink()
    (out / "spm.json").unlink()
    one = dataclasses.replace(cfg.data, corpora=[CorpusConfig(name="m30k", src=str(files[0]), tgt=str(files[1]))])
    tok_corpora, _ = prepare_tokenizers(dataclasses.replace(cfg, data=one), log=lambda _: None)
    assert tok_corpora.proto == expected


def test_a_multilingual_run_trains_one_tokenizer_over_all_languages_with_its_tags(four, corpus_slice, tmp_path):
    cfg = _config(corpus_slice, tmp_path, "tokenizer.vocab_size=600")
    cfg.data.corpora = [
        CorpusConfig(name=lang, src=str(four["en"]), tgt=str(four[lang]), src_lang="en", tgt_lang=lang)
        for lang in ("de", "fr", "cs")
    ] + [CorpusConfig(name="bt", src=str(four["en"]), tgt=str(four["de"]), src_lang="en", tgt_lang="de", tag="<BT>")]
    tok, tgt = prepare_tokenizers(cfg, log=lambda _: None)
    assert tgt is tok and tok.user_defined_symbols == frozenset(TAGS)
    # each language's first line decodes back exactly (its characters are in the vocabulary)
    for lang in LANGS:
        line = head(four[lang], 1)[0]
        assert tok.decode(tok.encode([line]))[0] == line, lang
    # the same files and settings again: reused, not retrained
    said: list[str] = []
    prepare_tokenizers(cfg, log=said.append)
    assert said and said[0].startswith("reusing sentencepiece model")


def _config(corpus: dict[str, Path], out_dir: Path, *overrides: str) -> Config:
    return load_config(
        None,
        [
            f"data.train_src={corpus['train.en']}",
            f"data.train_tgt={corpus['train.de']}",
            f"train.out_dir={out_dir}",
            *overrides,
        ],
    )


def _data(*targets: str) -> DataConfig:
    return DataConfig(corpora=[CorpusConfig(name=t or "x", src="a", tgt="b", tgt_lang=t) for t in targets])


def test_the_target_language_a_model_is_asked_for(tagged_tok):
    two, one, none = _data("de", "fr"), _data("de"), _data("")
    tags = language_tags(two, tagged_tok, "fr", where="m.pt", option="--tgt-lang")
    assert tags == ["<2fr>"]
    assert tagged(["A man.", "", "  ", "A dog."], tags) == ["<2fr> A man.", "", "  ", "<2fr> A dog."]
    assert target_language_tags(one, None, where="m.pt") == target_language_tags(one, "de", where="m.pt") == []
    assert target_language_tags(none, None, where="m.pt") == []
    refused = [
        (two, None, r"m.pt is multilingual \(target languages de, fr\); give the target language with --tgt-lang"),
        (two, "cs", r"--tgt-lang cs: m.pt does not translate into it; its target languages are de, fr"),
        (two, "French!", r"--tgt-lang: 'French!' is not a language code; use an ISO 639 code"),
        (two, "x" * 500, r"--tgt-lang: 'x{37}\.\.\.' is not a language code"),
        (one, "fr", r"--tgt-lang fr: m.pt does not translate into it; its target languages are de"),
        (none, "de", r"--tgt-lang de: m.pt states no target language .*; leave --tgt-lang out"),
    ]
    for data, lang, message in refused:
        with pytest.raises(TmtError) as info:
            language_tags(data, tagged_tok, lang, where="m.pt", option="--tgt-lang")
        assert re.match(message, str(info.value)) and "\n" not in str(info.value), str(info.value)
    many = _data(*[f"l{chr(97 + i)}{chr(97 + j)}" for i in range(3) for j in range(10)])
    with pytest.raises(TmtError, match=r"target languages laa, .*, lbj and 10 more\)"):
        target_language_tags(many, None, where="m.pt")
