"""`tmt import`: bring a model trained elsewhere in as a tmt checkpoint (the marian-hf leaf, transformer_mt.hf).

The leaf's libraries (safetensors) are imported only when the command runs; without them the command says in
one line which extra to install. `tmt export --format marian-hf` (cli/deploy.py) is the way back out.
"""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app

IMPORT_FORMATS = ("marian-hf",)


@app.command("import")
def import_model(
    directory: Path = typer.Argument(
        ...,
        help="The model directory, as save_pretrained writes it (config.json, model.safetensors, vocab.json, *.spm).",
    ),
    from_: str = typer.Option(..., "--from", help="Its format: marian-hf (Hugging Face MarianMT / OPUS-MT)."),
    output: Path = typer.Option(..., "--output", "-o", help="The tmt checkpoint to write (e.g. model.pt)."),
    force: bool = typer.Option(False, "--force", help="Replace the output file if it exists."),
) -> None:
    """Convert a model from another toolkit into a tmt checkpoint that every tmt command accepts."""
    from transformer_mt.errors import TmtError
    from transformer_mt.hf import import_marian

    if from_ not in IMPORT_FORMATS:
        raise TmtError(f"--from {from_!r} is not supported; choose one of: {', '.join(IMPORT_FORMATS)}")
    out = import_marian(directory, output, force=force)
    typer.echo(f"wrote {out} (from {from_} {directory}); translate with: tmt translate -c {out}")
