"""Each cleaning rule drops exactly what it says on hand-written pairs: the ones that must go, and near-misses that
must stay. Each rule runs alone (with ``empty``, always on), so a verdict is that rule's own."""

from __future__ import annotations

import pytest

from transformer_mt.cleaning import KEEP, PairFilter, nonletter_share, normalize_for_duplicates, script_share
from transformer_mt.cleaning.scripts import letter_script
from transformer_mt.config import FiltersConfig


def verdicts(pairs: list[tuple[str, str]], src_lang: str = "en", tgt_lang: str = "de", **filters) -> list[str]:
    pair_filter = PairFilter(FiltersConfig(**filters), src_lang, tgt_lang)
    return pair_filter.check([s for s, _ in pairs], [t for _, t in pairs])


def test_empty_is_always_on_and_means_whitespace_only():
    pairs = [("Hello", ""), ("  ", "Hallo"), ("Hi", "Hallo"), ("\t", "\u3000"), (".", "-")]
    assert verdicts(pairs) == ["empty", "empty", KEEP, "empty", KEEP]


def test_exact_duplicates_are_the_same_pair_after_stripping():
    pairs = [
        ("A cat.", "Eine Katze."),
        ("A cat.", "Eine Katze."),  # the same pair
        ("A cat.", "Eine Katze!"),  # another target: stays
        ("a cat.", "Eine Katze."),  # case differs: stays (exact)
        (" A cat.\t", "Eine Katze. "),  # surrounding whitespace, as training strips it
        ("Eine Katze.", "A cat."),  # the sides swapped: another pair
    ]
    assert verdicts(pairs, duplicates="exact") == [KEEP, "exact_duplicate", KEEP, KEEP, "exact_duplicate", KEEP]


def test_normalized_duplicates_ignore_case_digits_punctuation_and_compatibility_forms():
    pairs = [
        ("3 cats sleep.", "3 Katzen schlafen."),
        ("4 cats sleep", "4 Katzen schlafen"),  # other digits, no final stop
        ("12 CATS   sleep!", "12 Katzen schlafen!!"),  # a run of digits is one digit; case; spaces and "!"s
        ("\ufb01sh, \uff13 cats", "Fisch, 3 Katzen"),  # NFKC: the "fi" ligature, a fullwidth 3
        ("fish 7 cats", "Fisch - 8 Katzen"),
        ("3 cat sleeps.", "3 Katze schläft."),  # other words: stays
        ("3 cats sleep.", "3 Katzen schlafen nicht."),  # a word more: stays
        ("3 cats sleep.", "3 Katzen-schlafen."),  # a hyphen is punctuation: a space, the same words
    ]
    assert verdicts(pairs, duplicates="normalized") == [
        KEEP,
        "normalized_duplicate",
        "normalized_duplicate",
        KEEP,
        "normalized_duplicate",
        KEEP,
        KEEP,
        "normalized_duplicate",
    ]


def test_the_normalisation_as_stated():
    assert normalize_for_duplicates("  Ça  VA,  l'ami?! 2024 ") == "ça va l ami 0"
    assert normalize_for_duplicates("Straße") == "strasse"  # case folding, not only lowercasing
    assert normalize_for_duplicates("\u0663\u0664 cats") == "0 cats"  # Arabic-Indic digits are digits
    assert normalize_for_duplicates("cats") != normalize_for_duplicates("cat")


def test_identical_is_the_source_copied():
    pairs = [("Hello", "Hello"), ("Hello", "hello"), ("OK", " OK "), ("Berlin 2024", "Berlin 2024"), ("A", "B")]
    assert verdicts(pairs, identical=True) == ["identical", KEEP, "identical", "identical", KEEP]


def test_word_counts_on_either_side():
    pairs = [("a b c", "x y z"), ("a b", "x y z"), ("a b c", "x"), ("a b c d", "x y z"), ("a", "w x y z")]
    assert verdicts(pairs, min_words=3) == [KEEP, "too_few_words", "too_few_words", KEEP, "too_few_words"]
    assert verdicts(pairs, max_words=3) == [KEEP, KEEP, KEEP, "too_many_words", "too_many_words"]
    assert verdicts(pairs, min_words=2, max_words=3) == [KEEP, KEEP, "too_few_words", "too_many_words", "too_few_words"]


def test_length_ratio_longer_over_shorter_in_words_and_short_pairs_spared():
    pairs = [
        ("a b c d e", "v w x"),  # 5 / 3 < 2
        ("a b c d e f g", "x y z"),  # 7 / 3 > 2
        ("a b c d e f", "x y z"),  # 6 / 3 = 2: not above
        ("x", "a b c d e"),  # 5 / 1, the target the longer side
        ("a b c d", "x"),  # 4 / 1, but the longer side has fewer than 5 words: a short pair is spared
    ]
    assert verdicts(pairs, max_ratio=2) == [KEEP, "length_ratio", KEEP, "length_ratio", KEEP]


def test_nonletter_share_counts_every_character_but_spaces():
    assert nonletter_share("Ça va") == 0.0
    assert nonletter_share("C\u0327a va") == 0.0  # decomposed: the combining cedilla is a mark of its letter
    assert nonletter_share("हिन्दी") == 0.0  # Devanagari vowel signs and virama are marks
    assert nonletter_share("ab 12") == 0.5
    assert nonletter_share("12345 abc") == pytest.approx(5 / 8)
    pairs = [
        ("Ça va", "Es geht"),
        ("12345 abc", "Text"),  # 5 of 8
        ("ab 12", "Text"),  # exactly half: not above
        ("Hallo", "@@"),
        ("Привет!", "Hallo!"),  # 1 of 7
        ("Look :-) :-)", "Schau"),  # 6 of 10
    ]
    assert verdicts(pairs, max_nonletter=0.5) == [KEEP, "nonletter", KEEP, "nonletter", KEEP, "nonletter"]


def test_script_rule_by_the_unicode_names_of_letters():
    assert letter_script("ß") == "LATIN"
    assert letter_script("Ж") == "CYRILLIC"
    assert letter_script("Ａ") == "LATIN"  # FULLWIDTH LATIN CAPITAL LETTER A
    assert letter_script("中") == "CJK"
    pairs = [
        ("A dog runs.", "Ein Hund läuft über die Straße."),  # German in Latin script
        ("A dog runs.", "Собака бежит."),  # Cyrillic where German is expected
        ("A dog runs.", "Ο σκύλος τρέχει."),  # Greek
        ("Собака бежит.", "Ein Hund läuft."),  # the source side is judged too
        ("Ça va", "2024 !!!"),  # no letters at all: the script rule has nothing to judge
        ("I love Moscow", "Ich liebe Москва sehr"),  # 12 Latin letters of 18: a name in Cyrillic stays
        ("I love Moscow", "Я Москва sehr"),  # 4 Latin letters of 11
    ]
    assert verdicts(pairs, script=True) == [
        KEEP,
        "wrong_script",
        "wrong_script",
        "wrong_script",
        KEEP,
        KEEP,
        "wrong_script",
    ]
    assert script_share("Я люблю Python", frozenset({"CYRILLIC"})) == pytest.approx(6 / 12)
    assert verdicts([("Hello", "Привет"), ("Hello", "Hello there")], "eng", "rus_Cyrl", script=True) == [
        KEEP,
        "wrong_script",
    ]
    # Japanese is written in kanji (CJK) and kana; Korean Hangul is neither
    japanese = [("Hello", "中文句子"), ("Hello", "日本語のテキスト"), ("Hello", "한국어 문장")]
    assert verdicts(japanese, "en", "ja", script=True) == [KEEP, KEEP, "wrong_script"]


def test_script_rule_skips_a_language_it_does_not_know_with_a_note():
    pair_filter = PairFilter(FiltersConfig(script=True), "en", "xx")
    assert pair_filter.check(["A dog.", "Собака."], ["Собака.", "A dog."]) == [KEEP, "wrong_script"]
    (note,) = pair_filter.report().notes
    assert "wrong_script" in note and "target" in note and "'xx'" in note


def test_a_pair_is_counted_once_under_the_first_rule_in_order():
    everything = FiltersConfig(
        duplicates="exact", identical=True, min_words=2, max_words=6, max_ratio=2, max_nonletter=0.5, script=True
    )
    pairs = [
        ("@@ @@", "@@ @@"),  # identical, too few letters
        ("@@ @@", "@@ @@"),  # a duplicate first
        ("one", "@@"),  # too few words, and non-letters
        ("a b c d e f g", "Собака бежит по улице сейчас"),  # too many words, and the wrong script
        ("a b c d e f", "x y"),  # the ratio
        ("a b c", "Собака бежит"),  # the script alone
        ("A small dog", "Ein kleiner Hund"),
    ]
    pair_filter = PairFilter(everything, "en", "de")
    got = pair_filter.check([s for s, _ in pairs], [t for _, t in pairs])
    assert got == [
        "identical",
        "exact_duplicate",
        "too_few_words",
        "too_many_words",
        "length_ratio",
        "wrong_script",
        KEEP,
    ]
    report = pair_filter.report()
    assert report.read == 7 and report.kept == 1
    assert report.kept + sum(report.dropped.values()) == report.read
    assert list(report.dropped) == [
        "empty",
        "exact_duplicate",
        "identical",
        "too_few_words",
        "too_many_words",
        "length_ratio",
        "nonletter",
        "wrong_script",
    ]


def test_no_rule_enabled_drops_only_empty_pairs():
    pair_filter = PairFilter(FiltersConfig())
    assert not pair_filter.enabled and pair_filter.rules == ("empty",)
    assert pair_filter.check(["x", "x", ""], ["x", "x", "y"]) == [KEEP, KEEP, "empty"]


def test_script_and_langid_need_the_languages():
    from transformer_mt.cleaning import CleaningError

    with pytest.raises(CleaningError, match="data.filters.script needs the languages"):
        PairFilter(FiltersConfig(script=True), "en", "")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.filters.min_words=-1", "data.filters.min_words: -1 is negative"),
        ("data.filters.max_ratio=0.5", "data.filters.max_ratio: 0.5 is below 1"),
        ("data.filters.max_nonletter=1.5", "data.filters.max_nonletter: 1.5 is outside [0, 1]"),
        ("data.filters.langid_min_prob=0.9", "data.filters.langid_min_prob: applies only with data.filters.langid"),
    ],
)
def test_the_config_refuses_impossible_filters(override, expected):
    from transformer_mt.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, [override], check_files=False)
    assert load_config(None, ["data.filters.max_ratio=3", "data.filters.langid=true"], check_files=False)
