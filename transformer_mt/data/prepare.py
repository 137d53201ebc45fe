"""Turning a config into tokenizers and encoded corpora: shared by `tmt train` and `tmt preprocess`.

`tmt preprocess` runs this once (tokenizer training and corpus encoding, the slow parts on a
large corpus) so that `tmt train`, on any number of ranks, finds both ready and starts in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from transformer_mt.config import Config, ConfigError
from transformer_mt.data.corpus import DataError, ParallelData, load_parallel
from transformer_mt.text import Tokenizer, train_sentencepiece


def preprocess(cfg: Config, *, log: Callable[[str], None] = print) -> tuple[ParallelData, ParallelData | None]:
    """`tmt preprocess`: get the tokenizer(s) as `tmt train` would (training them into train.out_dir
    when tokenizer.model is empty) and encode the training and validation corpora into the cache
    `tmt train` reads; returns (training data, validation data or None). Training then starts in
    seconds, on any number of ranks, and reuses both the tokenizer and the cache."""
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src_tok, tgt_tok = prepare_tokenizers(cfg, log=log)
    return load_corpora(cfg, src_tok, tgt_tok, quiet=False)


def prepare_tokenizers(cfg: Config, *, log: Callable[[str], None]) -> tuple[Tokenizer, Tokenizer]:
    """The sentencepiece models named by cfg.tokenizer, or trained into train.out_dir (spm.model when
    joint, else spm.src.model and spm.tgt.model). A model trained there before on the same files with
    the same settings (by `tmt preprocess`, or a start that failed later) is reused, not retrained."""
    tok_cfg, data_cfg, out = cfg.tokenizer, cfg.data, Path(cfg.train.out_dir)
    check_has_text(cfg)  # before sentencepiece, whose own complaint names no file, and before any summary
    if tok_cfg.model:
        src = Tokenizer(tok_cfg.model)
        tgt = (
            src
            if tok_cfg.joint
            else Tokenizer(tok_cfg.tgt_model)
            if tok_cfg.tgt_model
            else _train_spm(cfg, [data_cfg.train_tgt], out / "spm.tgt", log)
        )
        return src, tgt
    if tok_cfg.joint:
        tok = _train_spm(cfg, [data_cfg.train_src, data_cfg.train_tgt], out / "spm", log)
        return tok, tok
    return _train_spm(cfg, [data_cfg.train_src], out / "spm.src", log), _train_spm(
        cfg, [data_cfg.train_tgt], out / "spm.tgt", log
    )


def _train_spm(cfg: Config, inputs: list[str], prefix: Path, log: Callable[[str], None]) -> Tokenizer:
    """Train PREFIX.model, recording its inputs (path, size, mtime, inode, ctime) and settings in PREFIX.json, or
    reuse PREFIX.model when PREFIX.json records the same ones."""
    tok_cfg = cfg.tokenizer
    model, recipe_path = prefix.parent / f"{prefix.name}.model", prefix.parent / f"{prefix.name}.json"
    recipe = {
        "inputs": [_file_identity(path) for path in inputs],
        **{
            key: getattr(tok_cfg, key)
            for key in ("model_type", "vocab_size", "character_coverage", "input_sentence_size")
        },
    }
    with contextlib.suppress(OSError, ValueError):
        if model.is_file() and json.loads(recipe_path.read_text(encoding="utf-8")) == recipe:
            log(f"reusing sentencepiece model {model} (trained earlier on the same files with the same settings)")
            return Tokenizer(model)
    log(f"training sentencepiece {tok_cfg.model_type} ({tok_cfg.vocab_size} pieces) on {', '.join(inputs)} -> {model}")
    recipe_path.unlink(missing_ok=True)
    train_sentencepiece(
        inputs,
        prefix,
        vocab_size=tok_cfg.vocab_size,
        model_type=tok_cfg.model_type,
        character_coverage=tok_cfg.character_coverage,
        input_sentence_size=tok_cfg.input_sentence_size,
    )
    recipe_path.write_text(json.dumps(recipe), encoding="utf-8")  # after the model: a crash in between retrains
    return Tokenizer(model)


def check_has_text(cfg: Config) -> None:
    """Refuse a training or validation file with no line of text (empty, or blank lines only), reading each only
    up to its first text: one line naming the file, before any tokenizer is trained or any summary printed."""
    data = cfg.data
    for key in ("train_src", "train_tgt"):
        path = getattr(data, key)
        if not path:
            raise ConfigError(f"data.{key} is empty: name the training file")
        if not _has_text(path):
            raise DataError(
                f"{path}: the training file holds no text (empty, or empty lines only); give data.{key} a corpus"
            )
    for path in (data.valid_src, data.valid_tgt) if data.valid_src and data.valid_tgt else ():
        if not _has_text(path):
            raise DataError(
                f"{path}: the validation file holds no text (empty, or empty lines only); give a validation set, "
                "or leave data.valid_src and data.valid_tgt empty to train without one"
            )


def _has_text(path: str) -> bool:
    with open(path, "rb") as handle:
        return any(line.strip() for line in handle)


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
    """The training corpus and the validation set (None when not configured), encoded into
    data.cache_dir (default <train.out_dir>/cache) unless already there."""
    data_cfg = cfg.data
    if not data_cfg.train_src or not data_cfg.train_tgt:
        raise ConfigError("data.train_src and data.train_tgt must name the training files")
    check_has_text(cfg)  # a resumed or fine-tuning run trains no tokenizer: check here too
    cache_dir = Path(data_cfg.cache_dir or Path(cfg.train.out_dir) / "cache")
    train_data = load_parallel(
        data_cfg.train_src, data_cfg.train_tgt, src_tok, tgt_tok, data_cfg, cache_dir=cache_dir, quiet=quiet
    )
    valid_data = None
    if data_cfg.valid_src and data_cfg.valid_tgt:
        valid_data = load_parallel(
            data_cfg.valid_src,
            data_cfg.valid_tgt,
            src_tok,
            tgt_tok,
            data_cfg,
            cache_dir=cache_dir,
            filter_long=False,
            quiet=quiet,
        )
    return train_data, valid_data
