"""`tmt bleu` and `tmt average`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from transformer_mt.cli.app import app


@app.command()
def bleu(
    ref: List[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeat for several references)."),
    hyp: Optional[Path] = typer.Argument(None, help="Hypothesis file (default: stdin)."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF."),
    tokenize: Optional[str] = typer.Option(None, "--tokenize", "-tok", help="BLEU tokenizer (sacreBLEU's; default 13a)."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    json_out: bool = typer.Option(False, "--json", help="sacreBLEU's JSON output."),
    width: int = typer.Option(1, "--width", "-w", help="Decimals to print."),
) -> None:
    """Corpus BLEU and chrF (and TER) with sacreBLEU, signature included."""
    from transformer_mt.metrics import MetricsError, format_json, format_text, read_lines, score

    hyp_name = "<stdin>" if hyp is None or str(hyp) == "-" else str(hyp)
    hyps = read_lines("-" if hyp is None else hyp)  # stdin read as bytes, decoded strictly like a file
    if not ref:
        raise MetricsError("give at least one --ref file")
    results = score(hyps, [read_lines(r) for r in ref], metrics=("bleu", "chrf"), lowercase=lowercase, tokenize=tokenize,
                    ter=ter, hyp_name=hyp_name, ref_names=[str(r) for r in ref])
    typer.echo(format_json(results, width=width) if json_out else format_text(results, width=width))


@app.command()
def average(
    checkpoints: List[Path] = typer.Argument(None, help="Checkpoint files to average (or give --run and --last)."),
    run: Optional[Path] = typer.Option(None, "--run", help="Run directory: average its newest numbered checkpoints."),
    last: int = typer.Option(5, "--last", help="With --run: how many of the newest checkpoints."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
) -> None:
    """Average model parameters of several checkpoints (the paper averages the last 5 or 20)."""
    from transformer_mt.checkpoint import CheckpointError, average_checkpoints, last_checkpoints, save_checkpoint

    paths = list(checkpoints or [])
    if run is not None:
        paths += last_checkpoints(run, last)
    if len(paths) < 2:
        raise CheckpointError("give at least two checkpoints, or --run RUN_DIR --last N")
    save_checkpoint(average_checkpoints(paths), output)
    typer.echo(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {output}", err=True)
