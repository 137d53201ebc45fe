"""The phases of a run, in order: the CPU plan (the default), the ``--device cuda`` plan and the CTranslate2 rows.

Each plan starts and ends with the matmul peak: a neighbour's burst during one short timing would
otherwise set the peak too low (and put a phase above 100% of it); the faster of the two is kept.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from transformer_mt.benchmark import peer
from transformer_mt.benchmark.settings import DTYPES, GPU_BATCH_TOKENS, REFERENCE_MODEL, REFERENCE_TRAIN, REPO, Sizes
from transformer_mt.benchmark.specs import train_spec, translate_spec
from transformer_mt.config import Config, DecodeConfig, ModelConfig, TrainConfig, load_config

SEARCHES = (("greedy", 1), ("beam5", 5))  # (name, beam) of every translation row


def reference_config(recipe: Config) -> Config:
    """The reference model (3+3 layers, d256, the size of the quoted fairseq figures) on the recipe's data and
    tokenizer."""
    return Config(
        model=ModelConfig(**REFERENCE_MODEL),
        train=TrainConfig(**REFERENCE_TRAIN),
        decode=DecodeConfig(),
        data=recipe.data,
        tokenizer=recipe.tokenizer,
    )


def translated_checkpoints(args: argparse.Namespace) -> list[tuple[str, Path, bool]]:
    """(model, checkpoint, representative) of each translated model on CPU: the reference model (the one the
    benchmark trains, unless --reference-checkpoint) and the recipe model with --checkpoint."""
    reference = args.reference_checkpoint or args.out / "runs" / "train-reference-float32" / "checkpoint_last.pt"
    checkpoints = [("reference", reference, args.reference_checkpoint is not None)]
    if args.checkpoint is not None:
        checkpoints.append(("recipe", args.checkpoint, True))
    return checkpoints


def cpu_plan(
    args: argparse.Namespace,
    sizes: Sizes,
    recipe: Config,
    *,
    spm: Path,
    ref_spm: Path,
    src: Path,
    tgt: Path,
    test_src: Path,
) -> list[dict]:
    """Matmul peak; training of the reference and the recipe model in each dtype and with plain ops; greedy and
    beam-5 translation of :func:`translated_checkpoints`; the sync counts; the peer runs with --peer; the peak again.
    With ``--only peer``: the peak and the peer runs alone."""
    train = functools.partial(train_spec, args=args, sizes=sizes, src=src, tgt=tgt)
    keep_ref = args.reference_checkpoint is None  # then the reference model's float32 run is the one translated
    matmul = {
        "kind": "matmul",
        "name": "matmul",
        "threads": args.threads,
        "n": sizes.matmul_n,
        "reps": sizes.matmul_reps,
    }
    specs = [matmul]
    for model, base, model_spm in (("reference", reference_config(recipe), ref_spm), ("recipe", recipe, spm)):
        for dtype in DTYPES:
            keep = keep_ref and model == "reference" and dtype == "float32"
            specs.append(train(f"train-{model}-{dtype}", base, dtype=dtype, spm=model_spm, keep=keep))
        specs.append(
            train(f"train-{model}-float32-plain", base, dtype="float32", spm=model_spm, keep=False, plain=True)
        )
    for model, checkpoint, representative in translated_checkpoints(args):
        for search, beam in SEARCHES:
            specs.append(
                translate_spec(
                    args,
                    model=model,
                    checkpoint=checkpoint,
                    representative=representative,
                    search=search,
                    beam=beam,
                    test_src=test_src,
                )
            )
    syncs = {
        **train("syncs-recipe-float32", recipe, dtype="float32", spm=spm, keep=False),
        "kind": "syncs",
        "input": str(test_src),
    }
    peers = peer.plan(args, sizes, spm=ref_spm, src=src, tgt=tgt) if args.peer else []
    specs = [matmul, *peers] if args.only == "peer" else [*specs, syncs, *peers]
    return [*specs, {**matmul, "name": "matmul-end"}]


def cuda_plan(
    args: argparse.Namespace, sizes: Sizes, recipe: Config, *, spm: Path, src: Path, tgt: Path, test_src: Path
) -> list[dict]:
    """The phases of ``--device cuda``: matmul peak (bf16, fp32 with TF32); training of the paper's base and big
    models at 25k-token batches and of the recipe model at its own, each in bf16 and fp32 (TF32), plus base
    and big compiled with torch.compile when --compile; greedy and beam-5 translation; the sync counts."""
    models = [
        ("base", load_config(REPO / "configs" / "transformer_base.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("big", load_config(REPO / "configs" / "transformer_big.yaml", check_files=False), GPU_BATCH_TOKENS),
        ("recipe", recipe, 0),
    ]
    train = functools.partial(train_spec, args=args, sizes=sizes, spm=spm, src=src, tgt=tgt, device="cuda")
    matmul = {
        "kind": "matmul",
        "name": "matmul",
        "threads": args.threads,
        "n": sizes.matmul_n,
        "reps": sizes.matmul_reps,
        "device": "cuda",
    }
    specs = [matmul]
    # without --checkpoint the recipe's bf16 run is translated (not representative: barely trained)
    keep_recipe = args.checkpoint is None
    for model, base, batch_tokens in models:
        for dtype in ("bfloat16", "float32"):
            keep = keep_recipe and model == "recipe" and dtype == "bfloat16"
            specs.append(train(f"train-{model}-{dtype}", base, dtype=dtype, keep=keep, max_tokens=batch_tokens))
        if args.compile and model != "recipe":
            name = f"train-{model}-bfloat16-compiled"
            specs.append(train(name, base, dtype="bfloat16", keep=False, max_tokens=batch_tokens, compile_step=True))
    checkpoint = args.checkpoint or args.out / "runs" / "train-recipe-bfloat16" / "checkpoint_last.pt"
    for search, beam, dtype in (("greedy", 1, "float32"), ("beam5", 5, "float32"), ("beam5", 5, "bfloat16")):
        specs.append(
            translate_spec(
                args,
                model="recipe",
                checkpoint=checkpoint,
                representative=not keep_recipe,
                search=search,
                beam=beam,
                test_src=test_src,
                name=f"translate-recipe-{search}-{dtype}",
                device="cuda",
                dtype=dtype,
            )
        )
    specs.append(
        {**train("syncs-recipe-float32", recipe, dtype="float32", keep=False), "kind": "syncs", "input": str(test_src)}
    )
    return [*specs, {**matmul, "name": "matmul-end"}]


def ctranslate2_specs(args: argparse.Namespace, test_src: Path) -> list[dict]:
    """The ``ctranslate2`` phases (``--ctranslate2``): every translated checkpoint, greedy and beam 5."""
    return [
        translate_spec(
            args,
            kind="ctranslate2",
            model=model,
            checkpoint=checkpoint,
            representative=representative,
            search=search,
            beam=beam,
            test_src=test_src,
        )
        for model, checkpoint, representative in translated_checkpoints(args)
        for search, beam in SEARCHES
    ]
