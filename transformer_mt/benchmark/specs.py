"""The benchmark's data (tokenizer and encoded corpus, made once under --out) and the spec of one phase."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

from transformer_mt.benchmark.settings import Sizes
from transformer_mt.config import Config, DataConfig, to_dict
from transformer_mt.data import load_parallel
from transformer_mt.text import Tokenizer, train_sentencepiece


def prepare_data(args: argparse.Namespace, recipe: Config, sizes: Sizes, vocab: int) -> tuple[Path, Path, Path]:
    """(spm model, train.en, train.de): the tokenizer trained once into <out>/spm and the corpus encoded
    once into <out>/cache (both reused by later runs; delete them to rebuild)."""
    src, tgt = args.data / "train.en", args.data / "train.de"
    if sizes.train_lines:
        sliced = args.out / "quick-data"
        sliced.mkdir(parents=True, exist_ok=True)
        for path in (src, tgt):
            with open(path, encoding="utf-8") as handle:
                (sliced / path.name).write_text("".join(itertools.islice(handle, sizes.train_lines)), encoding="utf-8")
        src, tgt = sliced / src.name, sliced / tgt.name
    tok = recipe.tokenizer
    prefix = args.out / "spm" / f"joint-{tok.model_type}{vocab}-{sizes.train_lines or 'all'}"
    if not prefix.with_suffix(".model").is_file():
        print(
            f"benchmark: training sentencepiece {tok.model_type} {vocab} -> {prefix}.model", file=sys.stderr, flush=True
        )
        train_sentencepiece(
            [src, tgt],
            prefix,
            vocab_size=vocab,
            model_type=tok.model_type,
            character_coverage=tok.character_coverage,
            input_sentence_size=tok.input_sentence_size,
        )
    spm = prefix.with_suffix(".model")
    tokenizer = Tokenizer(spm)
    load_parallel(
        src,
        tgt,
        tokenizer,
        tokenizer,
        data_config(recipe, src, tgt, args.out),
        cache_dir=args.out / "cache",
        quiet=True,
    )
    return spm, src, tgt


def data_config(recipe: Config, src: Path, tgt: Path, out: Path) -> DataConfig:
    """The recipe's data settings on the benchmark's training files, with no validation set."""
    return dataclasses.replace(
        recipe.data, train_src=str(src), train_tgt=str(tgt), valid_src="", valid_tgt="", cache_dir=str(out / "cache")
    )


def train_spec(
    name: str,
    base: Config,
    *,
    dtype: str,
    args: argparse.Namespace,
    sizes: Sizes,
    spm: Path,
    src: Path,
    tgt: Path,
    keep: bool,
    plain: bool = False,
    device: str = "cpu",
    compile_step: bool = False,
    max_tokens: int = 0,
) -> dict:
    """A ``train`` phase: ``base``'s model and optimiser for args.warmup + args.updates updates on the benchmark's
    data, never validating or saving before the end; ``keep`` keeps its checkpoint for a translate phase."""
    total = args.warmup + args.updates
    max_tokens = sizes.max_tokens or max_tokens  # --quick's tiny budget wins
    train = dataclasses.replace(
        base.train,
        out_dir=str(args.out / "runs" / name),
        device=device,
        threads=args.threads,
        dtype=dtype,
        max_updates=total,
        max_epochs=0,
        max_time=0.0,
        patience=0,
        log_every=total + 1,
        validate_every=total + 1,
        save_every=0,
        keep_last=1,
        update_freq=1,
        max_tokens=max_tokens or base.train.max_tokens,
    )
    cfg = Config(
        data=data_config(base, src, tgt, args.out),
        model=dataclasses.replace(base.model, **dict(sizes.model)),
        train=train,
        tokenizer=dataclasses.replace(base.tokenizer, model=str(spm), tgt_model="", joint=True),
        decode=base.decode,
    )
    return {
        "kind": "train",
        "name": name,
        "threads": args.threads,
        "config": to_dict(cfg),
        "warmup": args.warmup,
        "updates": args.updates,
        "flop_batches": 0 if device != "cpu" else sizes.flop_batches,
        "keep_checkpoint": keep,
        "plain_ops": plain,
        "compile": compile_step,
    }


def translate_spec(
    args: argparse.Namespace,
    *,
    model: str,
    checkpoint: Path,
    representative: bool,
    search: str,
    beam: int,
    test_src: Path,
    kind: str = "translate",
    name: str = "",
    **extra: str,
) -> dict:
    """A ``translate`` (or ``ctranslate2``) phase: ``checkpoint`` on the first args.sentences lines of ``test_src``;
    ``extra`` (device, dtype) is passed to the phase as it is."""
    return {
        "kind": kind,
        "name": name or f"{kind}-{model}-{search}",
        "threads": args.threads,
        "checkpoint": str(checkpoint),
        "input": str(test_src),
        "sentences": args.sentences,
        "beam": beam,
        "search": search,
        "model": model,
        "representative": representative,
        **extra,
    }
