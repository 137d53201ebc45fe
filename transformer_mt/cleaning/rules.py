"""The rules that look at one pair alone, each a function named for what it drops (True = drop).

Every rule sees a side as the reader gives it with the surrounding whitespace stripped, as training does.
Words are what ``str.split()`` returns: runs of characters between whitespace. That suits languages written
with spaces; a Chinese, Japanese or Thai sentence is one "word", so leave the word rules off for those.
"""

from __future__ import annotations

import re
import unicodedata

# A length ratio says little about a short pair: "Hello." / "Guten Tag!" is 1 word against 2, a ratio of 2. The
# ratio rule judges only pairs whose longer side has at least this many words (data.min_len_for_ratio's default,
# there in tokens).
RATIO_MIN_WORDS = 5

_DIGITS = re.compile(r"\d+")  # after NFKC: any Unicode decimal digit (category Nd)


def empty(src: str, tgt: str) -> bool:
    """A side with nothing but whitespace: no training pair at all."""
    return not src.strip() or not tgt.strip()


def identical(src: str, tgt: str) -> bool:
    """The target is the source, character for character (after stripping): an untranslated copy."""
    return src.strip() == tgt.strip()


def word_count(text: str) -> int:
    """Words of a side: runs of characters between whitespace."""
    return len(text.split())


def too_few_words(src_words: int, tgt_words: int, minimum: float) -> bool:
    """Either side has fewer than ``minimum`` words (0 = off)."""
    return minimum > 0 and min(src_words, tgt_words) < minimum


def too_many_words(src_words: int, tgt_words: int, maximum: float) -> bool:
    """Either side has more than ``maximum`` words (0 = off)."""
    return maximum > 0 and max(src_words, tgt_words) > maximum


def length_ratio(src_words: int, tgt_words: int, max_ratio: float) -> bool:
    """The longer side has more than ``max_ratio`` times the words of the shorter (0 = off); pairs whose longer
    side has fewer than :data:`RATIO_MIN_WORDS` words are never dropped here."""
    longer, shorter = max(src_words, tgt_words), min(src_words, tgt_words)
    return max_ratio > 0 and longer >= RATIO_MIN_WORDS and longer > max_ratio * shorter


def nonletter_share(text: str) -> float:
    """The share of a side's characters, whitespace aside, that are not letters. A letter is a character of a
    Unicode letter category (L*) or a mark (M*: the accents and vowel signs that letters carry in
    decomposed text and in Indic scripts); digits, punctuation, symbols and control characters are not."""
    counted = letters = 0
    for char in text:
        if char.isspace():
            continue
        counted += 1
        letters += unicodedata.category(char)[0] in "LM"
    return 1.0 - letters / counted if counted else 0.0


def nonletter(src: str, tgt: str, max_share: float) -> bool:
    """Either side has a share of non-letters (:func:`nonletter_share`) above ``max_share`` (0 = off)."""
    return max_share > 0 and max(nonletter_share(src), nonletter_share(tgt)) > max_share


def normalize_for_duplicates(text: str) -> str:
    """A side as the normalised duplicate rule compares it: Unicode NFKC, then case folded, then every run of
    digits made one "0", then every run of punctuation (P*) and whitespace made one space, the ends stripped.
    So "3 cats." and "12 Cats" are the same, "cats" and "cat" are not."""
    text = _DIGITS.sub("0", unicodedata.normalize("NFKC", text).casefold())
    chars = [" " if char.isspace() or unicodedata.category(char)[0] == "P" else char for char in text]
    return " ".join("".join(chars).split())
