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

Modules: ``run`` (start-up: options, address, loading, serving), ``options`` (``ServeOptions``, API keys),
``errors``, ``hosts`` (the Host check), ``app`` (the FastAPI app and its answers), ``schema`` (the request and
its text limits), ``guard`` (keys, byte cap, deadlines, disconnects), ``batching`` (cross-request batches),
``models`` (the served models), ``metrics`` (Prometheus), ``server`` (uvicorn).

A leaf: the core never imports it; fastapi, uvicorn and prometheus_client are imported only when a server is
built.
"""

from transformer_mt.serve.errors import INSTALL_HINT, ServeError, require_serving
from transformer_mt.serve.hosts import HostGuard, allowed_hosts
from transformer_mt.serve.options import ServeOptions, load_api_keys
from transformer_mt.serve.run import address_problem, serve

__all__ = [
    "INSTALL_HINT",
    "HostGuard",
    "ServeError",
    "ServeOptions",
    "address_problem",
    "allowed_hosts",
    "load_api_keys",
    "require_serving",
    "serve",
]
