"""`tmt export` and `tmt serve`: hand a trained model to an inference engine, or answer HTTP requests with it.

Both live in leaves (the export formats' converters, listed in cli/formats.py; transformer_mt.serve) whose optional
libraries are imported only when the command runs; without them the command says in one line which extra to install.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.common import COMPUTE_TYPE_HELP, ENGINE_HELP, build_translator
from transformer_mt.cli.formats import EXPORT_FORMATS, choices, exporter


@app.command(
    help="Convert a checkpoint for an inference engine or toolkit (CTranslate2, MarianMT): weights, vocabularies, "
    "sentencepiece models."
)
def export(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", "-c", help="A checkpoint written by `tmt train` or `tmt average`."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The model directory to write."),
    format: str = typer.Option(EXPORT_FORMATS[0].name, "--format", help=f"Target: {choices(EXPORT_FORMATS)}."),
    quantization: str | None = typer.Option(
        None,
        "--quantization",
        "-q",
        help="Weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16 "
        "(default: float32).",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace the output directory if an earlier tmt export wrote it and its files are unchanged "
        "(never anything else).",
    ),
) -> None:
    converter = exporter(format)  # the format's leaf is imported only now (cli/formats.py)
    out = converter.convert(checkpoint, output, quantization=quantization, force=force)
    typer.echo(converter.summary(out, quantization=quantization))


@app.command(
    help="Serve translations over HTTP (FastAPI + uvicorn): POST /translate, GET /health, /ready, /models, /metrics, "
    "/docs."
)
def serve(
    checkpoints: list[str] = typer.Option(
        ...,
        "--checkpoint",
        "-c",
        help="A checkpoint to serve, as PATH or NAME=PATH; repeat -c to serve several models "
        "(the first is the default).",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 = every interface)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    threads: int = typer.Option(0, "--threads", help="CPU threads for torch (0 = torch default)."),
    max_lines: int = typer.Option(256, "--max-lines", help="Most lines in one request (more: 413)."),
    max_chars: int = typer.Option(
        10_000,
        "--max-chars",
        help="Most characters in one line (more: 413). Lines over the model's token limit are truncated and "
        "reported in `warnings`.",
    ),
    max_beam: int = typer.Option(16, "--max-beam", help="Largest beam a request may ask for (more: 422)."),
    max_queue: int = typer.Option(
        256, "--max-queue", help="Requests waiting per model; when full, new requests get 503."
    ),
    batch_wait_ms: float = typer.Option(
        5.0, "--batch-wait-ms", help="How long a batch waits for the rest of a wave of concurrent requests."
    ),
    batch_tokens: int = typer.Option(
        0,
        "--batch-tokens",
        help="Source tokens per decode call; a larger request is decoded in chunks (0 = decode.batch_tokens).",
    ),
    timeout: float = typer.Option(
        60.0,
        "--timeout",
        help="Seconds from a request's headers to its answer; then 504 and its decoding stops (0 = none).",
    ),
    max_output_tokens: int = typer.Option(
        512,
        "--max-output-tokens",
        help="Longest output per line, whatever decode.max_len_a / max_len_b allow (0 = no cap).",
    ),
    header_timeout: float = typer.Option(
        10.0, "--header-timeout", help="Seconds for a request's headers to arrive; then the connection is closed."
    ),
    keep_alive_timeout: int = typer.Option(
        5, "--keep-alive-timeout", help="Seconds an idle keep-alive connection stays open."
    ),
    max_connections: int = typer.Option(
        1024, "--max-connections", help="Connections and requests at once; more get 503."
    ),
    shutdown_timeout: int = typer.Option(
        30, "--shutdown-timeout", help="Seconds SIGTERM waits for requests in flight (0 = no bound)."
    ),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        help="API keys, one a line: every path but /health and /ready then needs 'Authorization: Bearer KEY' or "
        "'X-API-Key: KEY'.",
    ),
    body_budget_mb: int = typer.Option(
        0,
        "--body-budget-mb",
        help="MiB of request bodies held at once, all connections together; more get 503 "
        "(0 = 8 bodies at the byte cap).",
    ),
    allowed_host: list[str] = typer.Option(
        [],
        "--allowed-host",
        help="Also answer this Host header (NAME or NAME:PORT; repeatable), e.g. the name a proxy forwards; '*' = any.",
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="uvicorn log level: critical, error, warning, info, debug."
    ),
    engine: str = typer.Option("tmt", "--engine", help=ENGINE_HELP),
    compute_type: str | None = typer.Option(None, "--compute-type", help=COMPUTE_TYPE_HELP),
) -> None:
    from transformer_mt.serve import ServeOptions, load_api_keys
    from transformer_mt.serve import serve as run_server

    opts = ServeOptions(
        max_lines=max_lines,
        max_chars=max_chars,
        max_beam=max_beam,
        max_queue=max_queue,
        batch_wait_ms=batch_wait_ms,
        batch_tokens=batch_tokens,
        timeout=timeout,
        max_output_tokens=max_output_tokens,
        header_timeout=header_timeout,
        keep_alive_timeout=keep_alive_timeout,
        max_connections=max_connections,
        shutdown_timeout=shutdown_timeout,
        api_keys=load_api_keys(api_key_file) if api_key_file else (),
        body_budget=body_budget_mb << 20,
        allowed_hosts=tuple(allowed_host),
    )
    load = None
    if engine != "tmt" or compute_type is not None:  # the checks of both options live in build_translator
        build = partial(
            build_translator,
            engine=engine,
            device=device,
            dtype="float32",
            threads=threads,
            weights=None,
            compute_type=compute_type,
        )
        load = lambda path: build([Path(path)])  # noqa: E731 - one checkpoint per served model
    run_server(
        checkpoints, host=host, port=port, device=device, threads=threads, options=opts, log_level=log_level, load=load
    )
