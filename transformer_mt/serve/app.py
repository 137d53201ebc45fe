"""The FastAPI application: the endpoints, the error answers, and the middleware in front of them.

Imported only after :func:`transformer_mt.serve.require_serving` found fastapi (which brings pydantic).
The request-to-answer path: :class:`~transformer_mt.serve.guard.Guard` (keys, body limit, deadline,
disconnects, metrics) -> validate and check the limits (``schema``) -> queue a
:class:`~transformer_mt.serve.batching.Job` on the model's Batcher (its worker tokenizes and decodes it
in chunks) -> await its future until the deadline -> answer. A
:class:`~transformer_mt.errors.TmtError` raised while decoding is the user's (422); anything else is a
500 whose details go to the server's log, never to the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from transformer_mt.config import to_dict
from transformer_mt.errors import TmtError
from transformer_mt.serve.batching import Arrivals, Batcher, Job, QueueFull, Stopped
from transformer_mt.serve.guard import BodyBudget, Guard, arrived, deadline_of, on_disconnect
from transformer_mt.serve.hosts import HostGuard
from transformer_mt.serve.metrics import CONTENT_TYPE, ServeMetrics
from transformer_mt.serve.models import ServedModel, load_models, serve_model
from transformer_mt.serve.options import ServeOptions
from transformer_mt.serve.schema import (
    ApiError,
    TranslateRequest,
    decode_settings,
    describe_validation,
    language_codes,
    language_tags,
    parse_request,
)
from transformer_mt.text import tagged, target_languages

__all__ = ["ApiError", "ServedModel", "TranslateRequest", "build_app", "load_models", "serve_model"]

log = logging.getLogger("uvicorn.error")
OPEN_PATHS = ("/health", "/ready")  # probes answer without an API key
BODY_PATHS = ("/translate",)  # the only paths whose (POST) body is read
OFF_LOOP_BYTES = 1 << 20  # a body larger than this is parsed on a worker thread, not on the event loop


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def build_app(models: list[ServedModel], options: ServeOptions, *, hosts: frozenset[str] | None) -> FastAPI:
    """The app serving ``models``; ``hosts``: the Host values it answers
    (:func:`~transformer_mt.serve.hosts.allowed_hosts` of its address; None: any)."""
    by_name = {m.name: m for m in models}
    started = time.time()
    metrics = ServeMetrics()
    arrivals = Arrivals()  # shared: a request's model is known only once its body is parsed
    for m in models:
        m.batcher.arrivals = arrivals
        events = metrics.for_model(m.name, depth=_gauge(m.batcher, "waiting"), alive=_gauge(m.batcher, "alive"))
        m.batcher.events = events
        if m.runner is not None:
            m.runner.events = events
    stopping = False

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        # uvicorn gets here after the requests in flight were answered (or --shutdown-timeout passed);
        # finish what is still queued within that bound too.
        nonlocal stopping
        stopping = True
        await asyncio.gather(*(asyncio.to_thread(m.batcher.stop, options.shutdown_timeout or None) for m in models))

    app = FastAPI(
        title="transformer_mt", summary="Transformer machine translation, batched across requests.", lifespan=lifespan
    )
    budget = BodyBudget(options.body_budget_bytes)
    metrics.body_bytes.set_function(lambda: float(budget.held))
    app.add_middleware(
        Guard,
        max_body=options.max_body_bytes,
        timeout=options.timeout,
        keys=options.api_keys,
        open_paths=OPEN_PATHS,
        body_paths=BODY_PATHS,
        budget=budget,
        metrics=metrics,
        arrivals=arrivals,
    )
    app.add_middleware(HostGuard, allowed=hosts)  # added last: the outermost, before any key or body is looked at
    _error_answers(app)

    # The body is parsed by parse_request (bounded before it is parsed), not by FastAPI: the schema is stated here
    # for /docs.
    body_schema = {"required": True, "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}}}

    @app.post("/translate", openapi_extra={"requestBody": body_schema})
    async def translate(request: Request) -> dict:
        """Translate one line or a list of lines; requests arriving together are decoded in one batch."""
        tic = time.perf_counter()
        body, content_type = await request.body(), request.headers.get("content-type")
        if (
            len(body) > OFF_LOOP_BYTES
        ):  # its checks and parse are C loops of up to ~0.1 s each: between them, the loop runs
            req = await asyncio.to_thread(parse_request, body, content_type, options)
        else:
            req = parse_request(body, content_type, options)
        served = _pick_model(by_name, req.model, default=models[0])
        beam, lenpen = decode_settings(served.translator, req, options)
        # a multilingual model's sources start with the language's tag: tagged lines of several languages share
        # one batch, and the worker measures and truncates them as the Translator will
        # (an NLLB model's: its codes, the source's before the pieces and the target's after the decoder's start)
        tags = language_tags(served.translator, req, model=served.name)
        codes = language_codes(served.translator, req, model=served.name)
        lines = tagged([req.text] if isinstance(req.text, str) else req.text, tags)
        loop = asyncio.get_running_loop()
        settings = (beam, lenpen, req.nbest, *codes)
        job = Job(lines, settings, loop.create_future(), loop, deadline=deadline_of(request.scope))
        on_disconnect(request.scope, lambda: _client_gone(job))
        try:
            served.batcher.submit(job)
        except QueueFull as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "1"}) from None
        except Stopped as exc:
            raise ApiError(503, str(exc)) from None
        finally:
            arrived(request.scope, arrivals)
        results = await _outcome(job, options)
        if req.nbest == 1:
            translations: list = [nb[0][1] for nb in results]
        else:
            translations = [[{"text": text, "score": round(score, 4)} for score, text in nb] for nb in results]
        ms = round(1000 * (time.perf_counter() - tic), 2)
        return {"translations": translations, "model": served.name, "time_ms": ms, "warnings": job.warnings}

    @app.get("/health")
    async def health() -> dict:
        """Liveness (the process answers) and the batching counters, summed over the models."""
        batchers = [m.batcher for m in models]
        return {
            "status": "ok",
            "models": [m.name for m in models],
            "uptime_s": round(time.time() - started, 1),
            **{
                key: sum(getattr(b, key) for b in batchers)
                for key in ("requests", "batches", "lines", "rejected", "dropped", "waiting")
            },
            "busy": any(b.busy for b in batchers),
            "body_bytes_held": budget.held,
        }

    @app.get("/ready", response_model=None)
    async def ready() -> dict | JSONResponse:
        """Readiness: every model's worker runs and its queue has room; 503 naming what is wrong otherwise."""
        problems = _unready(models, options, stopping=stopping)
        if problems:
            return JSONResponse(
                {"error": "not ready: " + "; ".join(problems)}, status_code=503, headers={"Retry-After": "1"}
            )
        return {"status": "ready", "models": [m.name for m in models]}

    @app.get("/models")
    async def list_models() -> dict:
        """Every served model: architecture, size, tokenizer, default decoding, limits, counters (no file paths)."""
        return {"default": models[0].name, "models": [_describe_model(m, options) for m in models]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Counters and histograms in the Prometheus text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


def _error_answers(app: FastAPI) -> None:
    """Every refusal as JSON ``{"error": one line}``."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(
        _request: Request, exc: RequestValidationError
    ) -> JSONResponse:  # parameters of a path, were one to take any
        errors = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in exc.errors()[:1]]
        status, message = describe_validation(errors)
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (
            "no such path; the API is POST /translate, GET /health, /ready, /models, /metrics (docs: /docs)"
            if exc.status_code == 404
            else str(exc.detail)
        )
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return JSONResponse(
            {"error": f"internal error ({type(exc).__name__}); the server's log has the details"}, status_code=500
        )


async def _outcome(job: Job, options: ServeOptions) -> list:
    """The job's n-best lists, or the ApiError that answers it: 504 past the deadline, 422 for a TmtError,
    503 when the server stopped first, 500 (details in the log) for anything else."""
    left = None if job.deadline == float("inf") else max(0.0, job.deadline - time.monotonic())
    try:
        return await asyncio.wait_for(job.future, left)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        job.drop("timeout")
        raise ApiError(
            504,
            f"no answer within --timeout {options.timeout:g} s; send fewer or shorter lines, or ask for a smaller beam",
        ) from None
    except ClientGone:
        raise ApiError(499, "the client closed the connection") from None  # never delivered; ends the handler
    except TmtError as exc:
        raise ApiError(422, str(exc)) from None
    except Stopped as exc:
        raise ApiError(503, str(exc)) from None
    except Exception as exc:
        log.error("translating a request failed", exc_info=exc)
        raise ApiError(
            500, f"internal error while translating ({type(exc).__name__}); the server's log has the details"
        ) from None


def _unready(models: list[ServedModel], options: ServeOptions, *, stopping: bool) -> list[str]:
    """Why the server should not get traffic now: stopping, a worker thread dead, a queue at its bound."""
    problems = ["the server is stopping"] if stopping else []
    for m in models:
        if not m.batcher.alive:
            problems.append(f"model {m.name!r}: its worker thread is not running")
        elif m.batcher.waiting >= options.max_queue:
            problems.append(f"model {m.name!r}: {m.batcher.waiting} requests waiting, the --max-queue bound")
    return problems


def _gauge(batcher: Batcher, attribute: str) -> Callable[[], float]:
    """A gauge read at scrape time: ``batcher.<attribute>`` as a float."""
    return lambda: float(getattr(batcher, attribute))


def _client_gone(job: Job) -> None:
    """The Guard heard the client leave: drop the job (queue or next chunk) and end the handler's wait."""
    if not job.future.done():
        job.drop("disconnected")
        job.future.set_exception(ClientGone())


def _pick_model(by_name: dict[str, ServedModel], name: str | None, *, default: ServedModel) -> ServedModel:
    if name is None:
        return default
    if name not in by_name:
        shown = repr(name if len(name) <= 60 else name[:60] + "...")
        raise ApiError(
            404, f"model: {shown} is not served; choose one of {', '.join(map(repr, by_name))} (GET /models)"
        )
    return by_name[name]


def _describe_model(m: ServedModel, options: ServeOptions) -> dict:
    tr, cfg = m.translator, m.translator.cfg
    b = m.batcher
    return {
        "name": m.name,
        "parameters": tr.num_parameters,
        "config": to_dict(cfg)["model"],
        # the tgt_lang values it takes: several, one required per request; one or none, tgt_lang optional
        "languages": cfg.model.decoder_languages.split() or target_languages(cfg.data),
        "src_lang": bool(cfg.model.decoder_languages),  # NLLB / M2M100: each request names src_lang too
        "tokenizer": {
            "src_vocab_size": tr.src_tok.vocab_size,
            "tgt_vocab_size": tr.tgt_tok.vocab_size,
            "joint": tr.src_tok.proto == tr.tgt_tok.proto,
        },
        "decode": {
            "beam": cfg.decode.beam,
            "lenpen": cfg.decode.lenpen,
            "max_len_a": cfg.decode.max_len_a,
            "max_len_b": cfg.decode.max_len_b,
        },
        "limits": {
            "max_lines": options.max_lines,
            "max_chars": options.max_chars,
            "max_beam": options.max_beam,
            "max_queue": options.max_queue,
            "max_src_tokens": tr.max_src_tokens,
            "max_output_tokens": options.max_output_tokens,
            "batch_tokens": b.batch_tokens,
            "batch_wait_ms": options.batch_wait_ms,
            "timeout_s": options.timeout,
        },
        "stats": {
            "requests": b.requests,
            "batches": b.batches,
            "lines": b.lines,
            "rejected": b.rejected,
            "dropped": b.dropped,
            "waiting": b.waiting,
        },
    }
