"""`tmt train` and `tmt preprocess`."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app


@app.command()
def train(
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML config (see configs/)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override one value: section.key=value (repeatable)."),
    resume: Path | None = typer.Option(
        None, "--resume", help="Run directory to continue exactly where it stopped (its newest complete checkpoint)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Start a new run in a train.out_dir that holds one, deleting that run's checkpoints."
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps; same as --set train.device=...",
    ),
    init_from: Path | None = typer.Option(
        None,
        "--init-from",
        help="Fine-tune: start from this checkpoint's weights, architecture and tokenizer (tmt's or `tmt import`'s), "
        "with a fresh optimizer; same as --set train.init_from=...",
    ),
) -> None:
    """Train a model with teacher forcing (writes checkpoints, logs and metrics to train.out_dir)."""
    from transformer_mt.training import train_from_cli

    overrides = list(set_) + ([f"train.device={device}"] if device else [])
    result = train_from_cli(config=config, overrides=overrides, resume=resume, overwrite=overwrite, init_from=init_from)
    if result.stop_reason == "interrupted":  # saved and resumable, but not finished: 128 + SIGINT, as shells report it
        raise typer.Exit(130)


@app.command()
def preprocess(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config, the one `tmt train` will use."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override one value: section.key=value (repeatable)."),
) -> None:
    """Encode the corpora once into the memory-mapped cache `tmt train` reads (for large corpora and multi-GPU runs)."""
    from transformer_mt.config import load_config
    from transformer_mt.data import preprocess as preprocess_corpora

    sets = preprocess_corpora(load_config(config, set_), log=lambda msg: typer.echo(msg, err=True))
    for summary in [one.data.summary for one in sets.train] + [one.data.summary for one in sets.valid]:
        typer.echo(summary.format())
