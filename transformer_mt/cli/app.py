"""The Typer application objects; the command modules register their commands on them."""

from __future__ import annotations

import typer

from transformer_mt import __version__

app = typer.Typer(
    name="tmt",
    help="transformer_mt: train and run Transformer machine-translation models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
tokenize_app = typer.Typer(help="Train a sentencepiece model; encode or decode text with it.", no_args_is_help=True)
app.add_typer(tokenize_app, name="tokenize")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """transformer_mt: train and run Transformer machine-translation models."""
