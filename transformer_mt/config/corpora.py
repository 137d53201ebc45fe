"""The checks of a run's corpora and validation sets (``data.corpora``, ``data.valid`` and their shorthands), and the
names they go by in the log, the metrics and a resume.

What needs the tokenizer or the language rules of :mod:`transformer_mt.text` (a tag that is one piece, a language
code that is one) is checked where the corpora are read (:mod:`transformer_mt.data.prepare`); everything here needs
the config alone, so ``load_config`` refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NoReturn

from transformer_mt.config.sections import CorpusConfig, DataConfig, ValidSetConfig

Fail = Callable[[str, str], NoReturn]

# a corpus or validation set's name: a key of metrics.jsonl (share/<name>, valid/<name>/bleu) and a word of the
# checkpoint's batching record, so one short word
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}")
SHORTHAND_CORPUS = "train"  # the name of the one corpus of data.train_src / train_tgt
SHORTHAND_VALID = "valid"  # the name of the one set of data.valid_src / valid_tgt, or of an unnamed one


def corpus_name(corpus: CorpusConfig) -> str:
    """A training corpus's name: its own, or "train" (one corpus may go unnamed)."""
    return corpus.name or SHORTHAND_CORPUS


def valid_set_name(valid: ValidSetConfig) -> str:
    """A validation set's name: its own, else its languages ("en-de"), else "valid"."""
    return valid.name or "-".join(lang for lang in (valid.src_lang, valid.tgt_lang) if lang) or SHORTHAND_VALID


def validation_sets(data: DataConfig) -> list[ValidSetConfig]:
    """The run's validation sets: ``data.valid``, or the one-set shorthand ``valid_src`` / ``valid_tgt``."""
    if data.valid:
        return list(data.valid)
    if data.valid_src and data.valid_tgt:
        return [ValidSetConfig(src=data.valid_src, tgt=data.valid_tgt)]
    return []


def data_files(data: DataConfig) -> list[tuple[str, str]]:
    """(key, path) of every corpus and validation file of ``data.corpora`` and ``data.valid``, for the file checks."""
    files = []
    for name, records in (("corpora", data.corpora), ("valid", data.valid)):
        for i, record in enumerate(records):
            files += [(f"data.{name}[{i}].{side}", getattr(record, side)) for side in ("src", "tgt")]
    return files


def check_corpora(data: DataConfig, fail: Fail) -> None:
    """The training corpora: one way of giving them, each with its files, a positive weight and a unique name; in a
    multilingual run (several target languages) every corpus names its target language."""
    if not data.corpora:
        return
    if data.train_src or data.train_tgt:
        given = "data.train_src" if data.train_src else "data.train_tgt"
        fail(given, f"is given beside data.corpora; list every training corpus under data.corpora and drop {given}")
    seen: dict[str, int] = {}
    for i, c in enumerate(data.corpora):
        where = f"data.corpora[{i}]"
        for side in ("src", "tgt"):
            if not getattr(c, side):
                fail(f"{where}.{side}", f"is empty; name the corpus's {'source' if side == 'src' else 'target'} file")
        if c.weight <= 0:
            fail(
                f"{where}.weight",
                f"{c.weight:g} is not positive; give a weight above 0 (1 = as it is), or remove the corpus",
            )
        if not c.name and len(data.corpora) > 1:
            fail(
                f"{where}.name", "is empty; with several corpora give each a short name (it labels the log and metrics)"
            )
        _check_name(corpus_name(c), f"{where}.name", i, seen, "corpus", fail)
    languages = list(dict.fromkeys(c.tgt_lang for c in data.corpora if c.tgt_lang))
    if len(languages) > 1:
        for i, c in enumerate(data.corpora):
            if not c.tgt_lang:
                fail(
                    f"data.corpora[{i}].tgt_lang",
                    f"is empty while other corpora name target languages ({', '.join(languages[:5])}); a multilingual "
                    "model starts each source with its target language's tag: give every corpus its tgt_lang",
                )


def check_valid_sets(data: DataConfig, fail: Fail) -> None:
    """The validation sets: one way of giving them, each with its files and a unique name. Where the corpora name
    target languages, the sets' tgt_lang must be among them and cover them all: always in a multilingual run (each
    set's sources start with its language's tag), and in a run of one target language once any set states one."""
    if data.valid and (data.valid_src or data.valid_tgt):
        given = "data.valid_src" if data.valid_src else "data.valid_tgt"
        fail(given, f"is given beside data.valid; list every validation set under data.valid and drop {given}")
    seen: dict[str, int] = {}
    for i, v in enumerate(data.valid):
        where = f"data.valid[{i}]"
        for side in ("src", "tgt"):
            if not getattr(v, side):
                fail(f"{where}.{side}", f"is empty; name the set's {'source' if side == 'src' else 'target'} file")
        if valid_set_name(v) == SHORTHAND_VALID and not v.name and len(data.valid) > 1:
            fail(f"{where}.name", "is empty and the set states no languages; give each of several sets a short name")
        _check_name(valid_set_name(v), f"{where}.name", i, seen, "validation set", fail)
    languages = list(dict.fromkeys(c.tgt_lang for c in data.corpora if c.tgt_lang))
    if not languages or not (data.valid or data.valid_src):
        return
    if len(languages) > 1 and not data.valid:
        fail(
            "data.valid_src",
            "a multilingual run validates each target language on its own; "
            "give data.valid sets, each with its tgt_lang",
        )
    if len(languages) == 1 and not any(v.tgt_lang for v in data.valid):
        return
    for i, v in enumerate(data.valid):
        if v.tgt_lang not in languages:
            shown = repr(v.tgt_lang[:40]) if v.tgt_lang else "empty"
            fail(
                f"data.valid[{i}].tgt_lang",
                f"is {shown}, not a target language of the corpora ({', '.join(languages[:5])}); "
                "its sources start with that language's tag: give one of them",
            )
    validated = {v.tgt_lang for v in data.valid}
    for lang in languages:
        if lang not in validated:
            fail(
                "data.valid",
                f"no set has tgt_lang {lang!r}, a target language of the corpora; add a validation set for it, so that "
                "each direction is validated (or give no validation sets)",
            )


def model_language(languages: Sequence[str], lang: str) -> str | None:
    """``lang`` as the language code of an NLLB / M2M100 model whose codes are ``languages``
    (``model.decoder_languages``): itself when listed (``fra_Latn``, ``__fr__``), M2M100's ``__fr__`` for ``fr``,
    else None."""
    if lang in languages:
        return lang
    wrapped = f"__{lang}__"
    return wrapped if wrapped in languages else None


def check_coded_pairs(data: DataConfig, languages: Sequence[str], fail: Fail, *, init_from: str) -> None:
    """The training and validation pairs of an NLLB / M2M100 model (``model.decoder_languages``: ``languages``):
    each source starts with its language's code and each target with its own, so every corpus and validation set
    names both languages, each one of the model's; the shorthands, which name none, are refused. Such a model is
    imported, never trained from scratch: training data without ``train.init_from`` are refused."""
    shown = ", ".join(languages[:4]) + (" ..." if len(languages) > 4 else "")
    if not init_from and (data.corpora or data.train_src):
        fail(
            "model.decoder_languages",
            "names an NLLB / M2M100 model's language codes, which only an imported model's tokenizer holds: import "
            "the model (tmt import --from m2m100-hf) and fine-tune it with --init-from",
        )
    for key in ("train_src", "valid_src"):
        if getattr(data, key):
            section = "data.corpora" if key == "train_src" else "data.valid"
            fail(
                f"data.{key}",
                f"an NLLB / M2M100 model (model.decoder_languages) reads the language codes of both sides: give the "
                f"pairs as {section}, each with src_lang and tgt_lang (its codes: {shown})",
            )
    for name, records in (("corpora", data.corpora), ("valid", data.valid)):
        for i, record in enumerate(records):
            for side in ("src_lang", "tgt_lang"):
                lang = getattr(record, side)
                if not lang or model_language(languages, lang) is None:
                    said = f"{lang[:40]!r} is not one of the model's language codes" if lang else "is empty"
                    fail(
                        f"data.{name}[{i}].{side}",
                        f"{said}; an NLLB / M2M100 model starts the {'source' if side == 'src_lang' else 'target'} "
                        f"with its code: give one of {shown}",
                    )


def _check_name(name: str, key: str, index: int, seen: dict[str, int], what: str, fail: Fail) -> None:
    if not NAME.fullmatch(name):
        shown = name if len(name) <= 40 else name[:37] + "..."
        fail(key, f"{shown!r} is not a name; use letters, digits, '-', '_', '.' or '+' (up to 40, e.g. en-de)")
    if name in seen:
        fail(key, f"{name!r} is also the name of the {what} at index {seen[name]}; give each {what} its own name")
    seen[name] = index
