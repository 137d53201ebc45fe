"""Languages of a run and the tags that name them.

A multilingual model (its corpora name more than one target language) learns which language to produce from a tag
put at the start of every source: ``<2fr>`` asks for French (Johnson et al., 2017, "Google's Multilingual Neural
Machine Translation System"; OPUS-MT's ``>>fra<<``). The tag goes on the source, not the decoder's first input as in
NLLB, so the encoder already knows the target language and the search starts every sentence from the same token:
greedy, beam, sampling, ensembles and CTranslate2 need nothing new. A corpus may add a tag of its own (``<BT>`` on
back-translated sources, Caswell et al., 2019, "Tagged Back-Translation"). Every tag is a user-defined symbol of the
sentencepiece model: always one piece, never split, and decoded back to its text.

A model with one target language takes no tag; ``--tgt-lang`` then only checks that it names that language.
:func:`language_tags` is what every translator (tmt's, CTranslate2's, the server, the explorer) asks for the tags a
source starts with, and the one place that refuses a target language; :func:`tagged` puts them on the source lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from transformer_mt.config import ConfigError, CorpusConfig, DataConfig
from transformer_mt.errors import TmtError

# ISO 639-1 / 639-3 codes, optionally with a script or region as NLLB writes them (fra_Latn, zh_Hant, pt-BR)
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[_-][A-Za-z]{2,4})?")
TAG = re.compile(r"<[^<>\s]{1,40}>")  # a corpus tag: one word in angle brackets, e.g. <BT>
LISTED = 20  # target languages named in one message, at most


class LanguageError(TmtError, ValueError):
    """A target language a model cannot be asked for, worded for the user."""


class TagTokenizer(Protocol):
    """What :func:`language_tags` needs of a tokenizer (``text.Tokenizer``, which imports this module)."""

    def tag_ids(self, tags: Sequence[str], *, where: str) -> list[int]: ...


def language_tag(code: str) -> str:
    """The source tag that asks a multilingual model for language ``code``: ``<2fr>``."""
    return f"<2{code}>"


def check_language_code(code: str, where: str) -> None:
    """Refuse a language code that is not one (``where`` names the key or option)."""
    if not LANGUAGE_CODE.fullmatch(code):
        shown = code if len(code) <= 40 else code[:37] + "..."
        raise ConfigError(
            f"{where}: {shown!r} is not a language code; use an ISO 639 code such as en, de, fra or fra_Latn"
        )


def check_tag(tag: str, where: str) -> None:
    """Refuse a corpus tag that sentencepiece could not keep as one symbol."""
    if not TAG.fullmatch(tag):
        shown = tag if len(tag) <= 40 else tag[:37] + "..."
        raise ConfigError(f"{where}: {shown!r} is not a tag; use one word in angle brackets without spaces, e.g. <BT>")


def training_corpora(data: DataConfig) -> list[CorpusConfig]:
    """The run's training corpora: ``data.corpora``, or the one-corpus shorthand ``train_src`` / ``train_tgt``."""
    if data.corpora:
        return list(data.corpora)
    if data.train_src or data.train_tgt:
        return [CorpusConfig(name="train", src=data.train_src, tgt=data.train_tgt)]
    return []


def target_languages(data: DataConfig) -> list[str]:
    """The distinct target languages the corpora name, in the order they first appear."""
    return list(dict.fromkeys(c.tgt_lang for c in training_corpora(data) if c.tgt_lang))


def is_multilingual(data: DataConfig) -> bool:
    """Whether sources carry a target-language tag: the corpora name more than one target language."""
    return len(target_languages(data)) > 1


def source_tags(corpus: CorpusConfig, *, multilingual: bool) -> list[str]:
    """The tags every source of ``corpus`` starts with, in order: the target language's, then the corpus's own."""
    tags = [language_tag(corpus.tgt_lang)] if multilingual and corpus.tgt_lang else []
    return tags + ([corpus.tag] if corpus.tag else [])


def tag_symbols(data: DataConfig) -> list[str]:
    """Every tag a run's sentencepiece model must hold as a user-defined symbol, each once."""
    multilingual = is_multilingual(data)
    return list(dict.fromkeys(t for c in training_corpora(data) for t in source_tags(c, multilingual=multilingual)))


def target_language_tags(data: DataConfig, tgt_lang: str | None, *, where: str, option: str = "tgt_lang") -> list[str]:
    """The tags a source starts with to ask the model of ``data`` for ``tgt_lang``: ``[<2fr>]`` for a multilingual
    model, none for a model with one target language (``tgt_lang`` may then be None or that language) or none stated
    (``tgt_lang`` must be None). Anything else is one line naming ``where`` (the model, for messages) and ``option``
    (how the caller gives the language: ``--tgt-lang``, ``tgt_lang``)."""
    languages = target_languages(data)
    if tgt_lang is None:
        if len(languages) > 1:
            raise LanguageError(
                f"{where} is multilingual (target languages {_listed(languages)}); give the target language with "
                f"{option}, e.g. {option} {languages[0]}"
            )
        return []
    check_language_code(tgt_lang, option)
    if not languages:
        raise LanguageError(
            f"{option} {tgt_lang}: {where} states no target language (its data.corpora name no tgt_lang); "
            f"leave {option} out"
        )
    if tgt_lang not in languages:
        raise LanguageError(
            f"{option} {tgt_lang}: {where} does not translate into it; its target languages are {_listed(languages)}"
        )
    return [language_tag(tgt_lang)] if len(languages) > 1 else []


def language_tags(
    data: DataConfig, tok: TagTokenizer, tgt_lang: str | None, *, where: str, option: str = "tgt_lang"
) -> list[str]:
    """:func:`target_language_tags`, each checked to be one piece of ``tok`` (a tag it would split is a
    TokenizerError naming ``where`` and the fix): what a translator prefixes its sources with (:func:`tagged`)."""
    tags = target_language_tags(data, tgt_lang, where=where, option=option)
    tok.tag_ids(tags, where=where)
    return tags


def tagged(lines: list[str], tags: Sequence[str]) -> list[str]:
    """Every line with text prefixed by ``tags`` (``"<2fr> A man."``), which the source tokenizer encodes as the tags'
    ids followed by the line's own (``Tokenizer.encode``): the sources the model was trained on. A blank line stays
    blank, so it still gives an empty translation."""
    if not tags:
        return lines
    prefix = " ".join(tags) + " "
    return [prefix + line if line.strip() else line for line in lines]


def _listed(languages: list[str]) -> str:
    """The languages as one short list: the first LISTED, then how many more."""
    more = len(languages) - LISTED
    return ", ".join(languages[:LISTED]) + (f" and {more} more" if more > 0 else "")
