"""The script rule: a side whose letters are mostly outside the script its language is written in.

A letter's script is the first word of its Unicode name (``unicodedata.name``): "LATIN SMALL LETTER A WITH
GRAVE" is LATIN, "CYRILLIC CAPITAL LETTER ZHE" is CYRILLIC, "CJK UNIFIED IDEOGRAPH-4E2D" is CJK; a FULLWIDTH or
HALFWIDTH form counts as the script after that word. Letters are the Unicode letter categories (L*); marks, digits,
punctuation and symbols do not count either way, so a side without letters ("2024", "!!!") passes.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

# A side passes when at least this share of its letters is in its language's scripts: names and brand names in
# another script ("Я люблю Python") stay, a German corpus line in Cyrillic does not.
SCRIPT_MIN_SHARE = 0.5

_LATIN = frozenset({"LATIN"})
_CYRILLIC = frozenset({"CYRILLIC"})
_ARABIC = frozenset({"ARABIC"})
_DEVANAGARI = frozenset({"DEVANAGARI"})

# The scripts each language is written in, by ISO 639-1 code; a language not here skips the rule.
SCRIPTS: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        "af ca cs cy da de en eo es et eu fi fr ga gl hr hu id is it lt lv ms mt nl no nb nn pl pt ro sk sl sq "
        "sv sw tl tr uz vi".split(),
        _LATIN,
    ),
    **dict.fromkeys("be bg kk ky mk mn ru tg uk".split(), _CYRILLIC),
    "sr": _LATIN | _CYRILLIC,  # Serbian is written in both
    "az": _LATIN | _CYRILLIC,
    **dict.fromkeys("ar fa ps ur".split(), _ARABIC),
    **dict.fromkeys("hi mr ne sa".split(), _DEVANAGARI),
    "el": frozenset({"GREEK"}),
    "he": frozenset({"HEBREW"}),
    "yi": frozenset({"HEBREW"}),
    "hy": frozenset({"ARMENIAN"}),
    "ka": frozenset({"GEORGIAN"}),
    "am": frozenset({"ETHIOPIC"}),
    "bn": frozenset({"BENGALI"}),
    "gu": frozenset({"GUJARATI"}),
    "pa": frozenset({"GURMUKHI"}),
    "ta": frozenset({"TAMIL"}),
    "te": frozenset({"TELUGU"}),
    "kn": frozenset({"KANNADA"}),
    "ml": frozenset({"MALAYALAM"}),
    "si": frozenset({"SINHALA"}),
    "th": frozenset({"THAI"}),
    "lo": frozenset({"LAO"}),
    "km": frozenset({"KHMER"}),
    "my": frozenset({"MYANMAR"}),
    "zh": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA"}),
    "ko": frozenset({"HANGUL", "CJK"}),
}

# ISO 639-2/3 codes of the languages above, for corpora named as NLLB names them (deu_Latn, fra, zho_Hans)
ALIASES = {
    "afr": "af", "amh": "am", "ara": "ar", "arb": "ar", "aze": "az", "bel": "be", "ben": "bn", "bul": "bg",
    "cat": "ca", "ces": "cs", "cze": "cs", "cym": "cy", "dan": "da", "deu": "de", "ger": "de", "ell": "el",
    "gre": "el", "eng": "en", "epo": "eo", "est": "et", "eus": "eu", "fas": "fa", "pes": "fa", "fin": "fi",
    "fra": "fr", "fre": "fr", "gle": "ga", "glg": "gl", "guj": "gu", "heb": "he", "hin": "hi", "hrv": "hr",
    "hun": "hu", "hye": "hy", "ind": "id", "isl": "is", "ita": "it", "jpn": "ja", "kat": "ka", "kan": "kn",
    "kaz": "kk", "khm": "km", "kor": "ko", "kir": "ky", "lao": "lo", "lit": "lt", "lav": "lv", "mkd": "mk",
    "mal": "ml", "mon": "mn", "mar": "mr", "msa": "ms", "zsm": "ms", "mlt": "mt", "mya": "my", "nep": "ne",
    "nld": "nl", "dut": "nl", "nor": "no", "nob": "nb", "nno": "nn", "pan": "pa", "pol": "pl", "por": "pt",
    "pus": "ps", "ron": "ro", "rum": "ro", "rus": "ru", "san": "sa", "sin": "si", "slk": "sk", "slv": "sl",
    "spa": "es", "sqi": "sq", "srp": "sr", "swe": "sv", "swa": "sw", "swh": "sw", "tam": "ta", "tel": "te",
    "tgk": "tg", "tgl": "tl", "tha": "th", "tur": "tr", "ukr": "uk", "urd": "ur", "uzb": "uz", "vie": "vi",
    "yid": "yi", "zho": "zh", "chi": "zh", "cmn": "zh",
}  # fmt: skip


def base_language(code: str) -> str:
    """The ISO 639-1 code of a language code: ``de``, ``deu``, ``deu_Latn`` and ``de-AT`` are all ``de``; a code
    this module does not know comes back as its lowercase first part."""
    first = code.replace("-", "_").split("_")[0].lower()
    return ALIASES.get(first, first)


def scripts_of(code: str) -> frozenset[str] | None:
    """The scripts language ``code`` is written in, or None when :data:`SCRIPTS` does not know it."""
    return SCRIPTS.get(base_language(code))


@lru_cache(maxsize=1 << 16)
def letter_script(char: str) -> str:
    """The script of one letter: the first word of its Unicode name, past FULLWIDTH / HALFWIDTH ("" unnamed)."""
    words = unicodedata.name(char, "").split()
    if words and words[0] in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1:
        return words[1]
    return words[0] if words else ""


def script_share(text: str, scripts: frozenset[str]) -> float:
    """The share of the letters (L*) of ``text`` that are in one of ``scripts``; 1.0 when it has no letters."""
    letters = inside = 0
    for char in text:
        if unicodedata.category(char)[0] == "L":
            letters += 1
            inside += letter_script(char) in scripts
    return inside / letters if letters else 1.0


def wrong_script(text: str, scripts: frozenset[str] | None) -> bool:
    """Fewer than :data:`SCRIPT_MIN_SHARE` of the side's letters are in ``scripts`` (None: language unknown, kept)."""
    return scripts is not None and script_share(text, scripts) < SCRIPT_MIN_SHARE
