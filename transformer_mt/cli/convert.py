"""`tmt import`: bring a model trained elsewhere in as a tmt checkpoint.

Each format's converter lives in its leaf and is listed in cli/formats.py; its libraries are imported only when the
command runs, and without them the command says in one line which extra to install. `tmt export` (cli/deploy.py) is
the way back out.
"""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.formats import IMPORT_FORMATS, choices, importer


@app.command("import")
def import_model(
    directory: Path = typer.Argument(
        ...,
        help="The model directory, as save_pretrained writes it (config.json, model.safetensors, vocab.json, *.spm).",
    ),
    from_: str = typer.Option(..., "--from", help=f"Its format: {choices(IMPORT_FORMATS)}."),
    output: Path = typer.Option(..., "--output", "-o", help="The tmt checkpoint to write (e.g. model.pt)."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Convert a model from another toolkit into a tmt checkpoint that every tmt command accepts."""
    out = importer(from_).convert(directory, output, force=force)  # the format's leaf is imported only now
    typer.echo(f"wrote {out} (from {from_} {directory}); translate with: tmt translate -c {out}")
