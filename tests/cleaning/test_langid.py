"""Language identification with py3langid: real Multi30k sentences identified right, a swapped pair dropped, and
without the extra one line naming it."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import head
from transformer_mt.cleaning import KEEP, CleaningError, PairFilter
from transformer_mt.cleaning import language_id as language_id_module
from transformer_mt.config import FiltersConfig

LANGS = ("en", "de", "fr", "cs")


@pytest.fixture(scope="module")
def sentences(multi30k) -> dict[str, list[str]]:
    """Eight training captions per language (from line 1001), the same eight in all four languages, of at least
    12 words on every side: shorter ones are identified less surely (py3langid takes 1.1% of Multi30k's Czech
    captions for Slovak, 0.3% of those of 10 words or more)."""
    lines = {lang: head(multi30k / f"train.{lang}", 200, skip=1000) for lang in LANGS}
    chosen = [i for i in range(200) if all(len(lines[lang][i].split()) >= 12 for lang in LANGS)][:8]
    assert len(chosen) == 8
    return {lang: [lines[lang][i] for i in chosen] for lang in LANGS}


@pytest.fixture(scope="module")
def py3langid():
    return pytest.importorskip("py3langid", reason='py3langid is not installed (pip install -e ".[langid]")')


@pytest.mark.parametrize(("src_lang", "tgt_lang"), [("en", "de"), ("en", "fr"), ("en", "cs"), ("de", "fr")])
def test_real_sentences_are_identified_right_and_swapped_pairs_dropped(py3langid, sentences, src_lang, tgt_lang):
    pair_filter = PairFilter(FiltersConfig(langid=True), src_lang, tgt_lang)
    srcs, tgts = sentences[src_lang], sentences[tgt_lang]
    assert pair_filter.check(srcs, tgts) == [KEEP] * len(srcs)
    assert pair_filter.check(tgts, srcs) == ["wrong_language"] * len(srcs)  # the sides swapped
    mixed = pair_filter.check(srcs[:2], [tgts[0], srcs[1]])  # an untranslated copy on the target side
    assert mixed == [KEEP, "wrong_language"]
    report = pair_filter.report()
    assert report.read == 2 * len(srcs) + 2 and report.dropped["wrong_language"] == len(srcs) + 1


def test_language_codes_of_other_forms_and_an_unknown_one(py3langid, sentences):
    pair_filter = PairFilter(FiltersConfig(langid=True), "eng", "deu_Latn")
    assert pair_filter.check(sentences["en"], sentences["de"]) == [KEEP] * len(sentences["en"])
    unknown = PairFilter(FiltersConfig(langid=True), "en", "tlh")  # Klingon: not among py3langid's languages
    assert unknown.check(sentences["en"][:1] * 2, [sentences["fr"][0], sentences["en"][1]]) == [KEEP, KEEP]
    (note,) = unknown.report().notes
    assert "target" in note and "'tlh'" in note
    assert unknown.check(sentences["de"][:1], sentences["de"][:1]) == ["wrong_language"]  # the source still judged


def test_min_prob_drops_pairs_identified_right_but_unsure(py3langid, sentences):
    src, tgt = sentences["en"][0], sentences["de"][0]
    ident = language_id_module.identifier()  # py3langid's own identifier, with probabilities
    (src_lang, src_prob), (tgt_lang, tgt_prob) = ident.classify(src), ident.classify(tgt)
    assert (src_lang, tgt_lang) == ("en", "de") and min(src_prob, tgt_prob) < 1
    lowest = min(src_prob, tgt_prob)
    for min_prob, verdict in (((lowest + 1) / 2, "uncertain_language"), (lowest / 2, KEEP)):
        pair_filter = PairFilter(FiltersConfig(langid=True, langid_min_prob=min_prob), "en", "de")
        assert pair_filter.check([src], [tgt]) == [verdict]
        assert pair_filter.rules[-2:] == ("wrong_language", "uncertain_language")


def test_without_py3langid_asking_for_langid_names_the_extra(monkeypatch):
    monkeypatch.setattr(language_id_module, "_IDENTIFIER", None)
    monkeypatch.setitem(sys.modules, "py3langid", None)  # import py3langid now raises ImportError
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)
    with pytest.raises(CleaningError) as error:
        PairFilter(FiltersConfig(langid=True), "en", "de")
    message = str(error.value)
    assert 'pip install -e ".[langid]"' in message and "\n" not in message
    assert PairFilter(FiltersConfig(script=True), "en", "de").check(["A dog."], ["Ein Hund."]) == [KEEP]
