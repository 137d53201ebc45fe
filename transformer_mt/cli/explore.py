"""`tmt explore`: a local web page showing a model translate one sentence (transformer_mt.explore, the serve extra)."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app


@app.command()
def explore(
    checkpoints: list[str] = typer.Option(
        ...,
        "--checkpoint",
        "-c",
        help="A checkpoint, as PATH or NAME=PATH; repeat -c for a second one (e.g. early and late) to switch between.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (127.0.0.1: this machine only)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    examples: Path | None = typer.Option(
        None,
        "--examples",
        help="Example source sentences, one per line, offered in the page's menu "
        "(default: none; a checkpoint's own files are never read).",
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, auto, cuda, cuda:N or mps."),
    threads: int = typer.Option(0, "--threads", help="CPU threads for torch (0 = torch default)."),
    max_chars: int = typer.Option(1000, "--max-chars", help="Most characters in a sentence (more: 413)."),
    max_beam: int = typer.Option(16, "--max-beam", help="Largest beam a request may ask for (more: 422)."),
    max_attention: int = typer.Option(
        2_000_000,
        "--max-attention",
        help="Most attention weights in one answer, layers x heads x (S^2 + T^2 + T*S) (more: 413).",
    ),
    allowed_host: list[str] = typer.Option(
        [],
        "--allowed-host",
        help="Also answer requests for this Host name (repeatable; '*' = any). Others get 421 (DNS rebinding).",
    ),
) -> None:
    """The model at work on one sentence, in a browser: translation and probabilities, beam search, attention, \
masks and positions."""
    from transformer_mt.explore.server import explore as run_explorer
    from transformer_mt.explore.session import Limits

    ready = lambda url: typer.echo(f"tmt explore: open {url} (Ctrl-C stops)")  # noqa: E731
    run_explorer(
        list(checkpoints),
        host=host,
        port=port,
        examples=examples,
        device=device,
        threads=threads,
        limits=Limits(max_chars=max_chars, max_beam=max_beam, max_attention=max_attention),
        allowed_extra=tuple(allowed_host),
        on_ready=ready,
    )
