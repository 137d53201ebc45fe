"""`tmt serve`: translations over HTTP, batched across requests (FastAPI + uvicorn, the `serve` extra).

API (the OpenAPI page is at /docs; docs/deploying.md is the operator's guide):

- ``POST /translate`` ``{"text": "..." | ["...", ...], "model": NAME, "beam": 5, "lenpen": 1.0, "nbest": 1}``
  -> ``{"translations": [...], "model": NAME, "time_ms": ..., "warnings": [...]}``: one translation per
  line, in order (a string; with nbest > 1 a list of ``{"text", "score"}``, best first). Only ``text`` is
  required; the others default to the first model and that checkpoint's decode settings. Text rules
  are ``tmt translate``'s: an empty line gives an empty translation; a line longer than the model's
  ``max_positions - 1`` pieces is truncated and named in ``warnings``.
- ``GET /health``: liveness (the process answers) and counters; ``GET /ready``: 200 while every model's
  worker runs and its queue has room, else 503; ``GET /metrics``: Prometheus text format.
- ``GET /models``: per model its name (never a file path), architecture, parameters, tokenizer, default
  decode settings, limits and counters.

Errors are JSON ``{"error": "one line naming the field and the fix"}``: 400 malformed JSON; 401 no valid API
key (with --api-key-file; /health and /ready stay open), answered before any body byte is read; 408 a body
or request head that did not arrive in time; 413 a body over the byte cap, more JSON values or lines than
--max-lines allows, a line over --max-chars characters, or a body sent to a path that takes none (unread);
415 a body not sent as ``Content-Type: application/json``; 421 a ``Host`` header that is not the server's
address or an --allowed-host (DNS rebinding); 422 wrong types (the first wrong line named), unknown fields,
an empty list, a line break inside a line, beam/nbest/lenpen out of range; 404 unknown model or path; 503
when the model's queue is full or the bodies held reach --body-budget-mb (both with Retry-After), or the
server is stopping; 504 no answer within --timeout.
SIGTERM (or Ctrl-C) stops accepting connections, finishes the requests in flight for at most
--shutdown-timeout seconds, then exits.

A leaf: the core never imports it; fastapi, uvicorn and prometheus_client are imported only when a server is built.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.errors import TmtError
from transformer_mt.serve.hosts import HostGuard, allowed_hosts

if TYPE_CHECKING:
    from transformer_mt.decoding import TextTranslator

__all__ = [
    "HostGuard",
    "ServeError",
    "ServeOptions",
    "address_problem",
    "allowed_hosts",
    "load_api_keys",
    "require_serving",
    "serve",
]

INSTALL_HINT = 'fastapi, uvicorn or prometheus-client is not installed; run: pip install -e ".[serve]"'
MIB = 1 << 20
# Request bodies at the cap held at once by default: enough for a burst of the largest requests; the
# connection cap (1024) times the body cap (30 MB by default) would be 30 GiB.
BODY_BUDGET_BODIES = 8
MIN_KEY_CHARS = (
    16  # shorter keys can be guessed; `python -c "import secrets; print(secrets.token_urlsafe(32))"` makes one
)


class ServeError(TmtError, ValueError):
    """A server that cannot start as asked, worded for the user."""


@dataclass
class ServeOptions:
    """Limits, deadlines, keys and batching of the service (see the module docstring for what answers what)."""

    max_lines: int = 256  # lines in one request; more -> 413
    max_chars: int = 10_000  # characters in one line; more -> 413 (model-length overflow is truncated instead)
    max_beam: int = 16  # largest beam a request may ask for; more -> 422
    max_queue: int = 256  # requests waiting per model; more -> 503
    batch_wait_ms: float = 5.0  # how long a batch waits for the rest of a wave of concurrent requests
    batch_tokens: int = 0  # source tokens per decode call (a large request is split into chunks); 0 = the checkpoint's decode.batch_tokens
    timeout: float = 60.0  # seconds from a request's headers to its answer; then 504 (0 = no deadline)
    max_output_tokens: int = (
        512  # longest output per line, whatever the checkpoint's max_len_a / max_len_b allow (0 = no cap)
    )
    header_timeout: float = 10.0  # seconds for a request head (headers) to arrive; then the connection is closed
    keep_alive_timeout: int = 5  # seconds an idle keep-alive connection stays open
    max_connections: int = 1024  # connections and requests at once; more get 503 from uvicorn
    shutdown_timeout: int = 30  # seconds SIGTERM waits for requests in flight before it closes them (0 = no bound)
    api_keys: tuple[str, ...] = field(
        default=(), repr=False
    )  # when set, every path but /health and /ready needs one (401); never printed
    body_budget: int = 0  # bytes of request bodies held at once, all connections together; more -> 503 (0 = BODY_BUDGET_BODIES bodies at the cap)
    allowed_hosts: tuple[
        str, ...
    ] = ()  # Host header values answered besides the bound address (hosts.allowed_hosts); "*" = any

    def check(self) -> None:
        for key in ("max_lines", "max_chars", "max_beam", "max_queue", "keep_alive_timeout", "max_connections"):
            if getattr(self, key) < 1:
                raise ServeError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be at least 1")
        for key in ("batch_wait_ms", "timeout", "max_output_tokens", "shutdown_timeout"):
            if not getattr(self, key) >= 0:  # NaN fails too
                raise ServeError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be >= 0 (0 = none)")
        if not self.header_timeout > 0:
            raise ServeError(f"--header-timeout {self.header_timeout}: must be > 0 seconds")
        if self.batch_tokens < 0:
            raise ServeError(
                f"batch_tokens={self.batch_tokens}: must be >= 0 (0 = the checkpoint's decode.batch_tokens)"
            )
        if self.body_budget and not self.body_budget >= self.max_body_bytes:
            raise ServeError(
                f"--body-budget-mb {self.body_budget / MIB:.4g}: less than one body at the cap ({self.max_body_bytes / MIB:.4g} MiB, "
                "from --max-lines x --max-chars); raise it, lower those, or give 0 for the default"
            )

    @property
    def max_body_bytes(self) -> int:
        """The raw body cap: the largest JSON the text limits allow, every character written in the longest
        encoding JSON has (a surrogate pair of ``\\uXXXX`` escapes, 12 bytes), so text within --max-lines and
        --max-chars is never refused for its encoding; the limits on the decoded text then apply exactly."""
        return self.max_lines * (12 * self.max_chars + 4) + 4096

    @property
    def body_budget_bytes(self) -> int:
        """The bytes of request bodies the server holds at once, all connections together."""
        return self.body_budget or BODY_BUDGET_BODIES * self.max_body_bytes


def load_api_keys(path: str | Path) -> tuple[str, ...]:
    """The keys of ``path``: one a line; blank lines and lines starting with # are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServeError(
            f"--api-key-file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc}); give a UTF-8 file of keys, one a line"
        ) from None
    keys = []
    for number, raw in enumerate(text.splitlines(), start=1):
        key = raw.strip()
        if not key or key.startswith("#"):
            continue
        if not key.isascii() or not key.isprintable() or " " in key or len(key) < MIN_KEY_CHARS:
            raise ServeError(
                f"--api-key-file {path}, line {number}: a key must be at least {MIN_KEY_CHARS} printable ASCII characters without spaces; "
                'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
            )
        keys.append(key)
    if not keys:
        raise ServeError(f"--api-key-file {path}: holds no key; write one key per line")
    return tuple(keys)


def require_serving() -> None:
    """Raise ServeError naming the install command when fastapi, uvicorn or prometheus_client is missing."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
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
    load: Callable[[str], TextTranslator] | None = None,
) -> None:
    """Load every checkpoint (``PATH`` or ``NAME=PATH``), then serve until SIGTERM / Ctrl-C. ``load`` builds the
    translator of a checkpoint path (None: tmt's ``Translator``; `tmt serve --engine ctranslate2` gives its engine)."""
    options = options or ServeOptions()
    options.check()
    hosts = allowed_hosts(host, port, options.allowed_hosts)
    require_serving()
    from uvicorn.config import LOG_LEVELS

    if log_level not in LOG_LEVELS:
        raise ServeError(f"--log-level {log_level}: choose one of {', '.join(LOG_LEVELS)}")

    import torch

    from transformer_mt import runtime
    from transformer_mt.serve.app import build_app, load_models
    from transformer_mt.serve.server import build_server

    problem = address_problem(host, port)  # before the (slow) model loading
    if problem:
        raise ServeError(problem)
    if not options.api_keys and not _is_loopback(host):
        print(
            f"tmt: warning: --host {host} accepts connections from other machines and no --api-key-file is set: anyone who reaches it can translate",
            file=sys.stderr,
        )
    # torch's CPU threads are set per calling thread (OpenMP): the worker threads decode with `threads`, and this
    # thread, which only loads the models and runs the event loop, keeps one. Two teams of `threads` would outnumber
    # the cores, and OpenMP then stops spinning between parallel regions: every small matmul of a decoding step
    # would wait for its threads to wake up (a single request about twice as slow as the same call made directly).
    workers = threads or torch.get_num_threads()
    runtime.set_threads(1)
    models = load_models(checkpoints, device=device, threads=workers, options=options, load=load)
    # uvicorn's own SIGTERM/SIGINT handling: stop listening, let in-flight requests finish (at most
    # --shutdown-timeout seconds), then run the app's shutdown (which drains the batch queues).
    build_server(build_app(models, options, hosts=hosts), options, host=host, port=port, log_level=log_level).run()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: loopback only if every address it has is
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def address_problem(host: str, port: int) -> str | None:
    """None when this process can listen on host:port, else one line saying why not (in use, not local, not a
    port): checked before the (slow) model loading, as uvicorn would find it after. `tmt explore` asks it too."""
    if not 0 <= port <= 65535:  # the socket calls would raise OverflowError, not OSError
        return f"--port {port}: must be 0 to 65535 (a TCP port); choose a free one, e.g. 8000"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
            probe.bind(addr)
    except OSError as exc:
        return f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); choose another --port or stop the program using it"
    return None
