"""Turning a config into tokenizers and encoded corpora: shared by `tmt train` and `tmt preprocess`.

`tmt preprocess` runs this once (tokenizer training and corpus encoding, the slow parts on a
large corpus) so that `tmt train`, on any number of ranks, finds both ready and starts in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer_mt.config import Config
from transformer_mt.data.corpus import ParallelData
from transformer_mt.data.datasets import Datasets, check_has_text, load_datasets
from transformer_mt.text import Tokenizer, tag_symbols, train_sentencepiece, training_corpora


def preprocess(cfg: Config, *, log: Callable[[str], None] = print) -> Datasets:
    """`tmt preprocess`: get the tokenizer(s) as `tmt train` would (training them into train.out_dir
    when tokenizer.model is empty) and encode every training corpus and validation set into the cache
    `tmt train` reads. Training then starts in seconds, on any number of ranks, and reuses both the
    tokenizer and the cache."""
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src_tok, tgt_tok = prepare_tokenizers(cfg, log=log)
    return load_datasets(cfg, src_tok, tgt_tok, quiet=False)


def prepare_tokenizers(cfg: Config, *, log: Callable[[str], None]) -> tuple[Tokenizer, Tokenizer]:
    """The sentencepiece models named by cfg.tokenizer, or trained into train.out_dir (spm.model when
    joint, else spm.src.model and spm.tgt.model). A model trained there before on the same files with
    the same settings (by `tmt preprocess`, or a start that failed later) is reused, not retrained.

    A trained model reads every corpus's files, all languages (over more than two, sampled per language so that a
    small one keeps its pieces: text.spm_input), and holds the run's tags (``<2fr>``, ``<BT>``) as user-defined
    symbols, one piece each; a given source model must already hold them. The one-corpus shorthand
    (data.train_src / train_tgt) trains on exactly those two files with the options it always had."""
    tok_cfg, data_cfg, out = cfg.tokenizer, cfg.data, Path(cfg.train.out_dir)
    check_has_text(cfg)  # before sentencepiece, whose own complaint names no file, and before any summary
    corpora, tags = training_corpora(data_cfg), tag_symbols(data_cfg)
    sources = [(c.src, c.src_lang) for c in corpora]
    targets = [(c.tgt, c.tgt_lang) for c in corpora]
    if tok_cfg.model:
        src = Tokenizer(tok_cfg.model)
        src.tag_ids(tags, where=f"tokenizer.model {tok_cfg.model}")  # a tag it would split: refused before training
        tgt = (
            src
            if tok_cfg.joint
            else Tokenizer(tok_cfg.tgt_model)
            if tok_cfg.tgt_model
            else _train_spm(cfg, targets, out / "spm.tgt", log)
        )
        return src, tgt
    if tok_cfg.joint:
        tok = _train_spm(cfg, sources + targets, out / "spm", log, tags=tags)
        return tok, tok
    return _train_spm(cfg, sources, out / "spm.src", log, tags=tags), _train_spm(cfg, targets, out / "spm.tgt", log)


def _train_spm(
    cfg: Config, files: list[tuple[str, str]], prefix: Path, log: Callable[[str], None], *, tags: Sequence[str] = ()
) -> Tokenizer:
    """Train PREFIX.model on ``files`` ((path, language code or "") each) with ``tags`` as user-defined symbols,
    recording its inputs (path, size, mtime, inode, ctime), languages, tags and settings in PREFIX.json, or reuse
    PREFIX.model when PREFIX.json records the same ones."""
    tok_cfg = cfg.tokenizer
    inputs = [path for path, _ in files]
    languages = [lang for _, lang in files] if any(lang for _, lang in files) else []
    model, recipe_path = prefix.parent / f"{prefix.name}.model", prefix.parent / f"{prefix.name}.json"
    recipe = {
        "inputs": [_file_identity(path) for path in inputs],
        **{
            key: getattr(tok_cfg, key)
            for key in ("model_type", "vocab_size", "character_coverage", "input_sentence_size")
        },
        # only when present: a recipe of the one-corpus shorthand stays as it was, and its model is reused
        **({"languages": languages} if languages else {}),
        **({"user_defined_symbols": list(tags)} if tags else {}),
    }
    with contextlib.suppress(OSError, ValueError):
        if model.is_file() and json.loads(recipe_path.read_text(encoding="utf-8")) == recipe:
            log(f"reusing sentencepiece model {model} (trained earlier on the same files with the same settings)")
            return Tokenizer(model)
    with_tags = f" with the tags {' '.join(tags)}" if tags else ""
    log(
        f"training sentencepiece {tok_cfg.model_type} ({tok_cfg.vocab_size} pieces{with_tags}) on "
        f"{', '.join(inputs)} -> {model}"
    )
    recipe_path.unlink(missing_ok=True)
    train_sentencepiece(
        inputs,
        prefix,
        vocab_size=tok_cfg.vocab_size,
        model_type=tok_cfg.model_type,
        character_coverage=tok_cfg.character_coverage,
        input_sentence_size=tok_cfg.input_sentence_size,
        user_defined_symbols=tags,
        languages=languages,
    )
    recipe_path.write_text(json.dumps(recipe), encoding="utf-8")  # after the model: a crash in between retrains
    return Tokenizer(model)


def _file_identity(path: str) -> dict:
    stat = os.stat(path)
    # ctime and inode too: an edit whose mtime was set back (`cp -p`, `touch -r`) still changes ctime
    return {
        "path": str(Path(path).resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "inode": stat.st_ino,
        "ctime_ns": stat.st_ctime_ns,
    }


def load_corpora(
    cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer, *, quiet: bool
) -> tuple[ParallelData, ParallelData | None]:
    """The training corpus and the (first) validation set, None when not configured, of a run of one training
    corpus, encoded into data.cache_dir (default <train.out_dir>/cache) unless already there; a run of several
    corpora reads them with :func:`load_datasets`."""
    if len(cfg.data.corpora) > 1:
        raise ValueError(f"load_corpora reads one training corpus, data.corpora lists {len(cfg.data.corpora)}")
    sets = load_datasets(cfg, src_tok, tgt_tok, quiet=quiet)
    return sets.train[0].data, sets.valid[0].data if sets.valid else None
