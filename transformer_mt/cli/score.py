"""`tmt bleu` and `tmt average`."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.common import safe_output


@app.command()
def bleu(
    ref: list[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeat for several references)."),
    hyp: Path | None = typer.Argument(None, help="Hypothesis file (default: stdin)."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF."),
    tokenize: str | None = typer.Option(None, "--tokenize", "-tok", help="BLEU tokenizer (sacreBLEU's; default 13a)."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    json_out: bool = typer.Option(False, "--json", help="sacreBLEU's JSON output."),
    width: int = typer.Option(
        1, "--width", "-w", min=0, max=16, help="Decimals to print (0-16; a float has about 16)."
    ),
) -> None:
    """Corpus BLEU and chrF (and TER) with sacreBLEU, signature included."""
    from transformer_mt.evaluation import MetricsError, format_json, format_text, read_lines, score

    hyp_name = "<stdin>" if hyp is None or str(hyp) == "-" else str(hyp)
    hyps = read_lines("-" if hyp is None else hyp)  # stdin read as bytes, decoded strictly like a file
    if not ref:
        raise MetricsError("give at least one --ref file")
    results = score(
        hyps,
        [read_lines(r) for r in ref],
        metrics=("bleu", "chrf"),
        lowercase=lowercase,
        tokenize=tokenize,
        ter=ter,
        hyp_name=hyp_name,
        ref_names=[str(r) for r in ref],
    )
    with safe_output(None) as out:  # stdout; a full disk names <stdout>
        out.write((format_json(results, width=width) if json_out else format_text(results, width=width)) + "\n")


@app.command()
def average(
    checkpoints: list[Path] = typer.Argument(None, help="Checkpoint files to average (or give --run and --last)."),
    run: Path | None = typer.Option(None, "--run", help="Run directory: average its newest numbered checkpoints."),
    last: int = typer.Option(5, "--last", min=1, help="With --run: how many of the newest checkpoints."),
    every: int = typer.Option(
        0,
        "--every",
        min=0,
        help="With --run: only checkpoints whose update is a multiple of K "
        "(a wider, LAWA-style window; train with train.keep_every=K to keep them).",
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
    weights: str | None = typer.Option(
        None,
        "--weights",
        help="ema or raw: which weights of each checkpoint to average (train.ema_decay). "
        "Default: ema when every checkpoint holds it, else raw.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an existing output file that is not an earlier average "
        "(never a directory, an input or a run's checkpoint).",
    ),
) -> None:
    """Average model parameters of several checkpoints (the paper averages the last 5 or 20)."""
    from transformer_mt.checkpoint import (
        CheckpointError,
        average_checkpoints,
        check_average_output,
        last_checkpoints,
        save_checkpoint,
    )

    paths = list(checkpoints or [])
    if every and run is None:
        raise CheckpointError(f"--every {every} picks from a run's numbered checkpoints; give --run RUN_DIR too")
    if run is not None:
        paths += last_checkpoints(run, last, every=every)
    if len(paths) < 2:
        raise CheckpointError("give at least two checkpoints, or --run RUN_DIR --last N")
    check_average_output(output, paths, force=force)
    averaged = average_checkpoints(paths, weights=weights)
    save_checkpoint(averaged, output)
    typer.echo(
        f"averaged the {averaged['averaged_weights']} weights of {len(paths)} checkpoints "
        f"({', '.join(p.name for p in paths)}) into {output}",
        err=True,
    )
