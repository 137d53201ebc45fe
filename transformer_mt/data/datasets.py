"""A run's training corpora and validation sets, read from its config and encoded: :func:`load_datasets`.

Each training corpus (``data.corpora``, or the one-corpus shorthand ``data.train_src`` / ``train_tgt``) is encoded
into a cache of its own (:mod:`transformer_mt.data.corpus`), its sources starting with the ids of its tags: the
target language's (``<2fr>``) in a multilingual run, then its own (``<BT>``), each one piece of the source tokenizer
(:func:`transformer_mt.text.source_tags`); its raw pairs first pass the cleaning rules of ``data.filters``, with the
corpus's languages, when any rule is on. Each validation set (``data.valid``, or ``valid_src`` / ``valid_tgt``)
starts its sources with its target language's tag in a multilingual run, and is neither cleaned nor length-filtered.
The shorthands read exactly as they always did: same caches, same pairs.

An NLLB / M2M100 model (``model.decoder_languages``, imported and fine-tuned with ``--init-from``) reads no ``<2fr>``
tag: every source starts with its language's code and every target with its own (``eng_Latn`` ... ``fra_Latn`` ...),
so that teacher forcing gives the decoder [``</s>``, ``fra_Latn``, pieces] and the labels [``fra_Latn``, pieces,
``</s>``], as transformers' NllbTokenizer makes them for fine-tuning (``text_target``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.config import (
    Config,
    ConfigError,
    CorpusConfig,
    DataConfig,
    FiltersConfig,
    ValidSetConfig,
    corpus_name,
    model_language,
    valid_set_name,
    validation_sets,
)
from transformer_mt.data.corpus import DataError, ParallelData, load_parallel
from transformer_mt.text import (
    Tokenizer,
    check_language_code,
    check_tag,
    is_multilingual,
    language_tag,
    source_tags,
    training_corpora,
)


@dataclass
class TrainingSet:
    """One training corpus of a run, encoded."""

    name: str  # data.corpora[i].name ("train" for the shorthand)
    key: str  # where the config states it: "data.corpora[1]", or "data.train_src" for the shorthand
    config: CorpusConfig  # its files, weight, languages and tag
    data: ParallelData


@dataclass
class ValidationSet:
    """One validation set of a run, encoded (not length-filtered)."""

    name: str  # data.valid[i]'s name, else its languages (config.valid_set_name); "valid" for the shorthand
    key: str  # "data.valid[1]", or "data.valid_src" for the shorthand
    config: ValidSetConfig
    data: ParallelData
    src_prefix: list[int]  # the tag ids its sources start with (its target language's in a multilingual run)
    tgt_prefix: list[int] = dataclasses.field(default_factory=list)  # an NLLB model's: its target language's code


@dataclass
class Datasets:
    """What :func:`load_datasets` read."""

    train: list[TrainingSet]
    valid: list[ValidationSet]  # empty without validation
    shorthand: bool  # the one corpus of data.train_src / train_tgt (trained on as it always was, unmixed)


def load_datasets(cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer, *, quiet: bool) -> Datasets:
    """Every training corpus and validation set of ``cfg``, encoded into data.cache_dir (default
    <train.out_dir>/cache) unless already there."""
    data = cfg.data
    check_has_text(cfg)  # a resumed or fine-tuning run trains no tokenizer: check here too
    cache_dir = Path(data.cache_dir or Path(cfg.train.out_dir) / "cache")
    multilingual, shorthand = is_multilingual(data), not data.corpora
    coded = cfg.model.decoder_languages.split()  # an NLLB model's language codes: none for tmt's own models
    train = []
    for i, corpus in enumerate(training_corpora(data)):
        key, name = ("data.train_src", corpus_name(corpus)) if shorthand else (f"data.corpora[{i}]", corpus.name)
        label = "" if shorthand else f"{key} ({name})"
        if coded:
            src_prefix, tgt_prefix = language_codes(corpus, coded, (src_tok, tgt_tok), where=label or key)
        else:
            tags = source_tags(corpus, multilingual=multilingual)
            src_prefix, tgt_prefix = (src_tok.tag_ids(tags, where=label or key) if tags else []), []
        loaded = load_parallel(
            corpus.src,
            corpus.tgt,
            src_tok,
            tgt_tok,
            data,
            cache_dir=cache_dir,
            quiet=quiet,
            src_prefix=src_prefix,
            tgt_prefix=tgt_prefix,
            pair_filter=cleaning_rules(data.filters, corpus, label=label or key),
            keys=None if shorthand else (f"{key}.src", f"{key}.tgt"),
            label=label,
        )
        loaded.summary.name = "" if shorthand else name
        train.append(TrainingSet(name, key, corpus, loaded))
    valid = []
    for i, v in enumerate(validation_sets(data)):
        key, name = (f"data.valid[{i}]", valid_set_name(v)) if data.valid else ("data.valid_src", valid_set_name(v))
        label = f"{key} ({name})" if data.valid else ""
        if coded:
            prefix, tgt_prefix = language_codes(v, coded, (src_tok, tgt_tok), where=label or key)
        else:
            prefix = src_tok.tag_ids([language_tag(v.tgt_lang)], where=label) if multilingual else []
            tgt_prefix = []
        loaded = load_parallel(
            v.src,
            v.tgt,
            src_tok,
            tgt_tok,
            data,
            cache_dir=cache_dir,
            filter_long=False,
            quiet=quiet,
            src_prefix=prefix,
            tgt_prefix=tgt_prefix,
            keys=(f"{key}.src", f"{key}.tgt") if data.valid else None,
            label=label,
        )
        loaded.summary.name = name if data.valid else ""
        valid.append(ValidationSet(name, key, v, loaded, prefix, tgt_prefix))
    return Datasets(train, valid, shorthand)


def language_codes(
    record: CorpusConfig | ValidSetConfig,
    languages: list[str],
    tokenizers: tuple[Tokenizer, Tokenizer],
    *,
    where: str,
) -> tuple[list[int], list[int]]:
    """The ids an NLLB / M2M100 model's pair of ``record`` starts with: [code of src_lang] (and a corpus's own tag)
    on the source, [code of tgt_lang] on the target; the config's checks made sure both are among ``languages``."""
    src_tok, tgt_tok = tokenizers
    src_code = model_language(languages, record.src_lang) or record.src_lang
    tgt_code = model_language(languages, record.tgt_lang) or record.tgt_lang
    own = [record.tag] if isinstance(record, CorpusConfig) and record.tag else []
    return src_tok.tag_ids([src_code, *own], where=where), tgt_tok.tag_ids([tgt_code], where=where)


# --------------------------------------------------------------------------- checks before any work


def check_has_text(cfg: Config) -> None:
    """Refuse a language code or tag that is not one, and a training or validation file with no line of text
    (empty, or blank lines only), reading each only up to its first text: one line naming the key or file, before
    any tokenizer is trained or any summary printed."""
    data = cfg.data
    check_languages(data, model_codes=cfg.model.decoder_languages.split())
    check_given_tokenizer(cfg)
    corpora = training_corpora(data)
    if not corpora:
        raise ConfigError("data.train_src is empty: name the training file")
    for i, corpus in enumerate(corpora):
        for side in ("src", "tgt"):
            key = f"data.corpora[{i}].{side}" if data.corpora else f"data.train_{side}"
            _check_file(getattr(corpus, side), key, "training file", "a corpus")
    for i, v in enumerate(validation_sets(data)):
        for side in ("src", "tgt"):
            if data.valid:
                _check_file(getattr(v, side), f"data.valid[{i}].{side}", "validation file", "a validation set")
            elif not _has_text(getattr(v, side)):
                raise DataError(
                    f"{getattr(v, side)}: the validation file holds no text (empty, or empty lines only); give a "
                    "validation set, or leave data.valid_src and data.valid_tgt empty to train without one"
                )


def check_languages(data: DataConfig, *, model_codes: Sequence[str] = ()) -> None:
    """Every language code a corpus or validation set states is one (or one of ``model_codes``, an NLLB / M2M100
    model's own, such as ``__fr__``), and every corpus tag is one word in angle brackets (ConfigError naming the
    key)."""
    for name, records in (("corpora", data.corpora), ("valid", data.valid)):
        for i, record in enumerate(records):
            for side in ("src_lang", "tgt_lang"):
                lang = getattr(record, side)
                if lang and lang not in model_codes:
                    check_language_code(lang, f"data.{name}[{i}].{side}")
    for i, corpus in enumerate(data.corpora):
        if corpus.tag:
            check_tag(corpus.tag, f"data.corpora[{i}].tag")


def check_given_tokenizer(cfg: Config) -> None:
    """A source tokenizer the user gives (tokenizer.model; not a fine-tuning run's, which is its checkpoint's) holds
    each corpus's tags as one piece each: a TokenizerError naming the corpus, the tag and the fix."""
    model, data = cfg.tokenizer.model, cfg.data
    if not model or cfg.train.init_from or not Path(model).is_file():
        return
    multilingual = is_multilingual(data)
    tagged = [(i, c, source_tags(c, multilingual=multilingual)) for i, c in enumerate(data.corpora)]
    tagged = [(i, c, tags) for i, c, tags in tagged if tags]
    if tagged:
        tok = Tokenizer(model)
        for i, corpus, tags in tagged:
            tok.tag_ids(tags, where=f"data.corpora[{i}] ({corpus.name}) with tokenizer.model {model}")


def _check_file(path: str, key: str, what: str, fix: str) -> None:
    if not path:
        raise ConfigError(f"{key} is empty: name the {what}")
    if not Path(path).is_file():
        raise DataError(
            f"{key}: {path}: file not found; check the path (relative paths start from the current directory)"
        )
    if not _has_text(path):
        raise DataError(f"{path}: the {what} holds no text (empty, or empty lines only); give {key} {fix}")


def _has_text(path: str) -> bool:
    with open(path, "rb") as handle:
        return any(line.strip() for line in handle)


# --------------------------------------------------------------------------- data.filters


class _Cleaning:
    """``data.filters`` over one corpus's raw pairs, as :class:`transformer_mt.data.corpus.PairFilter` asks: the
    rules of :mod:`transformer_mt.cleaning` with the corpus's languages."""

    def __init__(self, filters: FiltersConfig, corpus: CorpusConfig, *, label: str):
        from transformer_mt.cleaning import KEEP, PairFilter

        self._keep = KEEP
        self._filter = PairFilter(filters, corpus.src_lang, corpus.tgt_lang, corpus=label)
        self._key = {**dataclasses.asdict(filters), "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang}

    @property
    def enabled(self) -> bool:
        return self._filter.enabled

    def key(self) -> dict:
        return dict(self._key)

    def check(self, srcs: list[str], tgts: list[str]) -> Sequence[str]:
        return ["keep" if v == self._keep else v for v in self._filter.check(srcs, tgts)]


def cleaning_rules(filters: FiltersConfig, corpus: CorpusConfig, *, label: str) -> _Cleaning | None:
    """The cleaning rules ``filters`` turns on for ``corpus`` (named ``label`` in messages), or None when every rule
    is off (the corpus is then encoded, and cached, as without them)."""
    if filters == FiltersConfig():
        return None
    rules = _Cleaning(filters, corpus, label=label)
    return rules if rules.enabled else None
