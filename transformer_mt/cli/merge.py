"""`tmt merge`: a LoRA run's checkpoint with its adapters folded into the base weights, as an ordinary checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app


@app.command(
    help="Fold a LoRA checkpoint's adapters into its weights (W + alpha/r B A): an ordinary checkpoint that every "
    "command takes."
)
def merge(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c", help="A checkpoint of a run with train.lora."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="The checkpoint to write (default: beside it, <name>.merged.pt)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    from transformer_mt.training import merge_checkpoint  # torch only when the command runs

    out = merge_checkpoint(checkpoint, output, force=force)
    typer.echo(f"wrote {out} (the adapters of {checkpoint} merged); translate with: tmt translate -c {out}")
