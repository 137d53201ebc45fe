"""`tmt serve`: translations over HTTP, batched across requests (FastAPI + uvicorn, the `serve` extra).

API (the OpenAPI page is at /docs):

- ``POST /translate`` ``{"text": "..." | ["...", ...], "model": NAME, "beam": 5, "lenpen": 1.0, "nbest": 1}``
  -> ``{"translations": [...], "model": NAME, "time_ms": ..., "warnings": [...]}``: one translation per
  line, in order (a string; with nbest > 1 a list of ``{"text", "score"}``, best first). Only ``text`` is
  required; the others default to the first model and that checkpoint's decode settings. Text rules
  are ``tmt translate``'s: an empty line gives an empty translation; a line longer than the model's
  ``max_positions - 1`` pieces is truncated and named in ``warnings``.
- ``GET /health``: status and counters (requests, batches, lines, rejected, waiting); batches < requests
  means requests were decoded together.
- ``GET /models``: per model its checkpoint, architecture, parameters, tokenizer, default decode
  settings, limits and counters.

Errors are JSON ``{"error": "one line naming the field and the fix"}``: 400 malformed JSON; 415 a body
not sent as ``Content-Type: application/json``; 422 wrong types, unknown fields, an empty list, a line
break inside a line, beam/nbest out of range; 413 more than --max-lines lines or a line over
--max-chars characters; 404 unknown model or path; 503 when the model's queue is full (with
Retry-After) or the server is stopping. SIGTERM (or Ctrl-C) stops
accepting connections, finishes the requests in flight, then exits.

A leaf: the core never imports it; fastapi and uvicorn are imported only when a server is built.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from transformer_mt.errors import TmtError

INSTALL_HINT = 'fastapi and uvicorn are not installed; run: pip install -e ".[serve]"'


class ServeError(TmtError, ValueError):
    """A server that cannot start as asked, worded for the user."""


@dataclass
class ServeOptions:
    """Limits and batching of the service (see the module docstring for what answers what)."""

    max_lines: int = 256  # lines in one request; more -> 413
    max_chars: int = 10_000  # characters in one line; more -> 413 (model-length overflow is truncated instead)
    max_beam: int = 16  # largest beam a request may ask for; more -> 422
    max_queue: int = 256  # requests waiting per model; more -> 503
    batch_wait_ms: float = 5.0  # how long a batch's first request waits for others to join it
    batch_tokens: int = 0  # source tokens that close a batch early; 0 = the checkpoint's decode.batch_tokens

    def check(self) -> None:
        for key in ("max_lines", "max_chars", "max_beam", "max_queue"):
            if getattr(self, key) < 1:
                raise ServeError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be at least 1")
        if self.batch_wait_ms < 0:
            raise ServeError(f"--batch-wait-ms {self.batch_wait_ms}: must be >= 0")
        if self.batch_tokens < 0:
            raise ServeError(f"batch_tokens={self.batch_tokens}: must be >= 0 (0 = the checkpoint's decode.batch_tokens)")


def require_serving() -> None:
    """Raise ServeError naming the install command when fastapi or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ServeError(INSTALL_HINT) from None


def serve(
    checkpoints: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
    threads: int = 0,
    options: ServeOptions | None = None,
    log_level: str = "info",
) -> None:
    """Load every checkpoint (``PATH`` or ``NAME=PATH``), then serve until SIGTERM / Ctrl-C."""
    options = options or ServeOptions()
    options.check()
    require_serving()
    import uvicorn
    from uvicorn.config import LOG_LEVELS

    if log_level not in LOG_LEVELS:
        raise ServeError(f"--log-level {log_level}: choose one of {', '.join(LOG_LEVELS)}")

    from transformer_mt.serve.app import build_app, load_models

    _check_address(host, port)  # before the (slow) model loading
    models = load_models(checkpoints, device=device, threads=threads, options=options)
    app = build_app(models, options)
    # uvicorn's own SIGTERM/SIGINT handling: stop listening, let in-flight requests finish, then run the
    # app's shutdown (which drains the batch queues).
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).run()


def _check_address(host: str, port: int) -> None:
    """Refuse at once an address this process cannot listen on (in use, not local), as uvicorn would after loading."""
    if not 0 <= port <= 65535:  # the socket calls would raise OverflowError, not OSError
        raise ServeError(f"--port {port}: must be 0 to 65535 (a TCP port); choose a free one, e.g. 8000")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
            probe.bind(addr)
    except OSError as exc:
        raise ServeError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); choose another --port or stop the program using it"
        ) from None
