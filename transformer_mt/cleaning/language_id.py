"""The language identification rule, with py3langid (the optional extra ``langid``).

py3langid is langid.py (Lui and Baldwin, 2012: a naive Bayes model over byte n-grams, 97 languages) with its
model inside the wheel (``py3langid/data/model.npz.xz``, read with ``numpy.load(allow_pickle=False)``): nothing
is downloaded when it runs. Its probabilities (``norm_probs=True``) are a softmax of the class scores, tempered by
the square root of the text's length in bytes. Each side is identified among all 97 languages; the pair is dropped
when either side is identified as another language, or, with ``langid_min_prob``, as its own with less than that
probability. py3langid is imported only here, when a filter with ``langid`` is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformer_mt.cleaning.errors import CleaningError
from transformer_mt.cleaning.scripts import base_language

if TYPE_CHECKING:
    from collections.abc import Sequence

INSTALL = 'pip install -e ".[langid]"'

_IDENTIFIER: Any = None  # one py3langid model per process (about a second to load), shared by every filter


def identifier() -> Any:
    """py3langid's identifier with probabilities, loaded once; a CleaningError naming the extra without it."""
    global _IDENTIFIER
    if _IDENTIFIER is None:
        try:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier
        except ImportError:
            raise CleaningError(f"data.filters.langid needs py3langid, which is not installed; run {INSTALL}") from None
        _IDENTIFIER = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _IDENTIFIER


def langid_code(code: str) -> str | None:
    """The label py3langid gives language ``code`` (``deu_Latn`` -> ``de``), or None when it does not know it."""
    label = base_language(code)
    return label if label in identifier().labels else None


def identify(texts: Sequence[str]) -> list[tuple[str, float]]:
    """(language, probability) of each text, as py3langid's best guess among all its languages."""
    ident = identifier()
    return [ident.classify(text) for text in texts]


def wrong_language(found: tuple[str, float], expected: str | None) -> bool:
    """The side was identified as another language than ``expected`` (None: not identifiable, kept)."""
    return expected is not None and found[0] != expected


def uncertain_language(found: tuple[str, float], expected: str | None, min_prob: float) -> bool:
    """The side was identified as ``expected`` but with less than ``min_prob`` probability (0 = off)."""
    return expected is not None and min_prob > 0 and found[0] == expected and found[1] < min_prob
