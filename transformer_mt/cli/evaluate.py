"""`tmt evaluate`: translate a test set and score it."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.common import (
    BEAM_HELP,
    CKPT_HELP,
    COMPUTE_TYPE_HELP,
    ENGINE_HELP,
    LENPEN_HELP,
    SRC_LANG_HELP,
    TGT_LANG_HELP,
    WEIGHTS_HELP,
    build_translator,
    decode_args,
)


@app.command()
def evaluate(
    checkpoints: list[Path] = typer.Option(..., "--checkpoint", "-c", help=CKPT_HELP),
    src: Path = typer.Option(..., "--src", help="Source text file."),
    ref: list[Path] = typer.Option(..., "--ref", help="Reference file (repeat for several references)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Where to write the hypotheses (default: SRC name + .hyp next to the checkpoint)."
    ),
    beam: int | None = typer.Option(None, "--beam", "-b", help=BEAM_HELP),
    lenpen: float | None = typer.Option(None, "--lenpen", help=LENPEN_HELP),
    batch_tokens: int | None = typer.Option(None, "--batch-tokens", min=1, help="Source tokens per batch."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16 (GPU)."),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU threads (0 = torch default)."),
    weights: str | None = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    engine: str = typer.Option("tmt", "--engine", help=ENGINE_HELP),
    compute_type: str | None = typer.Option(None, "--compute-type", help=COMPUTE_TYPE_HELP),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help=TGT_LANG_HELP),
    src_lang: str | None = typer.Option(None, "--src-lang", help=SRC_LANG_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
) -> None:
    """Translate SRC, write the hypotheses, print BLEU, chrF, sentences/s and target tokens/s."""
    import json

    from transformer_mt.decoding import LanguageTranslator
    from transformer_mt.evaluation import evaluate_file

    tr = build_translator(
        checkpoints,
        engine=engine,
        device=device,
        dtype=dtype,
        threads=threads,
        weights=weights,
        compute_type=compute_type,
    )
    tr = LanguageTranslator(
        tr, tgt_lang, where=str(checkpoints[0]), option="--tgt-lang", src_lang=src_lang
    )  # refused before any input
    beam, lenpen = decode_args(tr, beam, lenpen, 1)
    output = output or checkpoints[0].parent / f"{src.name}.{checkpoints[0].stem}.hyp"
    result = evaluate_file(
        tr,
        src,
        ref,
        output=output,
        beam=beam,
        lenpen=lenpen,
        batch_tokens=batch_tokens,
        lowercase=lowercase,
        keep_intact=checkpoints,
    )
    if result.stats.warning():
        typer.echo(result.stats.warning(), err=True)
    typer.echo(json.dumps(result.report()) if json_out else "\n".join(result.text()))
