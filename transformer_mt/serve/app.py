"""The FastAPI application: request schema, limits, the error answers, the three endpoints.

Imported only after :func:`transformer_mt.serve.require_serving` found fastapi (which brings pydantic).
The request-to-answer path: validate -> tokenize (for lengths and the truncation warnings) -> queue a
:class:`~transformer_mt.serve.batching.Job` on the model's :class:`~transformer_mt.serve.batching.Batcher`
-> await its future -> answer. User mistakes are :class:`ApiError` (status + one line); a
:class:`~transformer_mt.errors.TmtError` raised while decoding is the user's too (422).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from transformer_mt.config import beam_problem, lenpen_problem, to_dict
from transformer_mt.decoding import Translator
from transformer_mt.errors import TmtError
from transformer_mt.serve import ServeError, ServeOptions
from transformer_mt.serve.batching import Batcher, Job, QueueFull, Stopped


class ApiError(Exception):
    """An answer other than 200: HTTP status and one line naming the problem and the fix."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


class TranslateRequest(BaseModel):
    """The body of POST /translate. Strict types: "5" is not a beam, true is not a number."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] = Field(description="One line, or a list of lines; one translation per line, in order.")
    model: str | None = Field(None, description="A served model's name (GET /models); default: the first.")
    beam: int | None = Field(None, description="Beam size, 1 = greedy; default: the checkpoint's decode.beam.")
    lenpen: float | None = Field(None, allow_inf_nan=False, description="GNMT length penalty alpha; default: decode.lenpen.")
    nbest: int = Field(1, description="Hypotheses per line (1..beam); > 1 returns [{text, score}, ...] per line.")


@dataclass
class ServedModel:
    """One checkpoint being served: its name, translator and batch queue."""

    name: str
    path: str
    translator: Translator
    batcher: Batcher


def load_models(specs: list[str], *, device: str, threads: int, options: ServeOptions) -> list[ServedModel]:
    """``PATH`` or ``NAME=PATH`` per checkpoint; a name defaults to the file's stem and must be unique."""
    named: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():  # a path that itself holds "=" stays a path
            name, path = Path(spec).stem, spec
        if name in (n for n, _ in named):
            raise ServeError(f"-c {spec}: a model named {name!r} is already served; name them apart with -c NAME=PATH")
        named.append((name, path))
    models = []
    for name, path in named:
        tr = Translator.from_checkpoint(path, device=device, threads=threads)
        batch_tokens = options.batch_tokens or tr.cfg.decode.batch_tokens
        batcher = Batcher(_translate_fn(tr), name=name, max_queue=options.max_queue, batch_tokens=batch_tokens, wait_s=options.batch_wait_ms / 1000)
        models.append(ServedModel(name, path, tr, batcher))
    return models


def _translate_fn(tr: Translator):
    """The worker's call: n-best lists, one per line, in order. The Translator keeps no state between
    calls, so the one worker thread per model could become several without a lock."""

    def run(lines: list[str], *, beam: int, lenpen: float, nbest: int) -> list:
        return tr.translate_batch(lines, beam=beam, lenpen=lenpen, nbest=nbest).hypotheses

    return run


def build_app(models: list[ServedModel], options: ServeOptions) -> FastAPI:
    by_name = {m.name: m for m in models}
    started = time.time()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        # uvicorn gets here after the in-flight requests were answered; drain anything still queued.
        await asyncio.gather(*(asyncio.to_thread(m.batcher.stop) for m in models))

    app = FastAPI(title="transformer_mt", summary="Transformer machine translation, batched across requests.", lifespan=lifespan)

    # A body larger than the most the limits allow (every line at --max-chars, 4 UTF-8 bytes per character,
    # JSON quoting) is refused before it is read and parsed.
    max_body = options.max_lines * (4 * options.max_chars + 8) + 4096

    @app.middleware("http")
    async def _body_size(request: Request, call_next):
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > max_body:
            message = f"body: {int(size)} bytes, more than this server's limits allow ({max_body}: --max-lines x --max-chars); split the request"
            return JSONResponse({"error": message}, status_code=413)
        return await call_next(request)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _describe_validation(exc.errors())
        return JSONResponse({"error": message}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "no such path; the API is POST /translate, GET /health, GET /models (docs: /docs)" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.post("/translate")
    async def translate(req: TranslateRequest) -> dict:
        """Translate one line or a list of lines; requests arriving together are decoded in one batch."""
        tic = time.perf_counter()
        served = _pick_model(by_name, req.model, default=models[0])
        lines = [req.text] if isinstance(req.text, str) else req.text
        beam, lenpen = _decode_settings(served.translator, req, options)
        _check_lines(lines, options)
        ntokens, warnings = _measure(served.translator, lines)
        loop = asyncio.get_running_loop()
        job = Job(lines, ntokens, (beam, lenpen, req.nbest), loop.create_future(), loop)
        try:
            served.batcher.submit(job)
        except QueueFull as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "1"}) from None
        except Stopped as exc:
            raise ApiError(503, str(exc)) from None
        try:
            results = await job.future
        except TmtError as exc:
            raise ApiError(422, str(exc)) from None
        if req.nbest == 1:
            translations: list = [nb[0][1] for nb in results]
        else:
            translations = [[{"text": text, "score": round(score, 4)} for score, text in nb] for nb in results]
        return {"translations": translations, "model": served.name, "time_ms": round(1000 * (time.perf_counter() - tic), 2), "warnings": warnings}

    @app.get("/health")
    async def health() -> dict:
        """Liveness and the batching counters, summed over the models."""
        batchers = [m.batcher for m in models]
        return {
            "status": "ok",
            "models": [m.name for m in models],
            "uptime_s": round(time.time() - started, 1),
            **{key: sum(getattr(b, key) for b in batchers) for key in ("requests", "batches", "lines", "rejected", "waiting")},
            "busy": any(b.busy for b in batchers),
        }

    @app.get("/models")
    async def list_models() -> dict:
        """Every served model: checkpoint, architecture, size, tokenizer, default decoding, limits, counters."""
        return {"default": models[0].name, "models": [_describe_model(m, options) for m in models]}

    return app


def _pick_model(by_name: dict[str, ServedModel], name: str | None, *, default: ServedModel) -> ServedModel:
    if name is None:
        return default
    if name not in by_name:
        raise ApiError(404, f"model: {name!r} is not served; choose one of {', '.join(map(repr, by_name))} (GET /models)")
    return by_name[name]


def _decode_settings(tr: Translator, req: TranslateRequest, options: ServeOptions) -> tuple[int, float]:
    """The request's beam and lenpen (the checkpoint's when absent), checked before the request is queued:
    beam within --max-beam and the target vocabulary, 1 <= nbest <= beam, lenpen within config.lenpen_problem's bound."""
    beam, lenpen = tr.decode_defaults(req.beam, req.lenpen)
    problem = beam_problem(beam, req.nbest, tgt_vocab_size=tr.tgt_tok.vocab_size, limit=options.max_beam) or lenpen_problem(lenpen)
    if problem:
        raise ApiError(422, f"{problem.key}: {problem.value} {problem.reason}")
    return beam, lenpen


def _check_lines(lines: list[str], options: ServeOptions) -> None:
    if not lines:
        raise ApiError(422, "text: an empty list; send one line or a list of at least one line")
    if len(lines) > options.max_lines:
        raise ApiError(413, f"text: {len(lines)} lines, more than --max-lines {options.max_lines}; split the request")
    for i, line in enumerate(lines):
        if "\n" in line or "\r" in line:
            raise ApiError(422, f"text[{i}]: contains a line break; send one line per list item")
        if len(line) > options.max_chars:
            raise ApiError(413, f"text[{i}]: {len(line)} characters, more than --max-chars {options.max_chars}; split the line")
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON's "\ud800": a lone surrogate, which no tokenizer can encode
                raise ApiError(
                    422, f"text[{i}]: is not valid Unicode (a lone surrogate \\u{ord(line[exc.start]):04x} at character {exc.start}); send whole characters"
                ) from None


def _measure(tr: Translator, lines: list[str]) -> tuple[int, list[str]]:
    """Source tokens of the request (pieces + EOS per non-empty line) and one warning per line the model
    will truncate (the Translator truncates exactly these, as `tmt translate` does)."""
    pieces = tr.src_tok.encode(lines)
    warnings = [
        f"text[{i}]: {len(p)} pieces, truncated to {tr.max_src_tokens} (model.max_positions={tr.max_src_tokens + 1})"
        for i, p in enumerate(pieces)
        if len(p) > tr.max_src_tokens and lines[i].strip()
    ]
    return sum(min(len(p), tr.max_src_tokens) + 1 for p, line in zip(pieces, lines) if line.strip()), warnings


def _describe_validation(errors: Sequence[dict]) -> tuple[int, str]:
    """pydantic / FastAPI validation errors -> (status, one line): 400 for a body that is not JSON, 415 for a
    body not declared as JSON, else 422."""
    if any(e.get("type") == "json_invalid" for e in errors):
        e = next(e for e in errors if e.get("type") == "json_invalid")
        loc = e.get("loc", ())
        at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return 400, f'malformed JSON{at} ({e.get("ctx", {}).get("error", e.get("msg"))}); send a JSON object such as {{"text": "A man."}}'
    body = next((e for e in errors if tuple(e.get("loc", ())) == ("body",)), None)
    if body is not None and isinstance(body.get("input"), (bytes, str)):  # FastAPI parses JSON only when the client says it is JSON
        return 415, 'the body was not sent as JSON; send it with the header "Content-Type: application/json"'
    # A union (text: str | list[str]) reports one error per member; the deepest location is the most specific.
    e = max(errors, key=lambda err: len(err.get("loc", ())))
    parts = [p for p in e.get("loc", ())[1:] if p not in ("str", "list[str]")]  # drop "body" and union member tags
    field = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(parts)) or "body"
    if field == "body":  # no body, or JSON that is not an object
        return 422, 'body: not a JSON object; send a JSON object such as {"text": "A man."}'
    if e.get("type") == "extra_forbidden":
        return 422, f"{field}: unknown field; the fields are text, model, beam, lenpen, nbest"
    got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], (dict, list)) else ""
    return 422, f"{field}: {e.get('msg', 'invalid')}{got}"


def _describe_model(m: ServedModel, options: ServeOptions) -> dict:
    tr, cfg = m.translator, m.translator.cfg
    b = m.batcher
    return {
        "name": m.name,
        "checkpoint": m.path,
        "parameters": sum(p.numel() for p in tr.model.parameters()),
        "config": to_dict(cfg)["model"],
        "tokenizer": {"src_vocab_size": tr.src_tok.vocab_size, "tgt_vocab_size": tr.tgt_tok.vocab_size, "joint": tr.src_tok.proto == tr.tgt_tok.proto},
        "decode": {"beam": cfg.decode.beam, "lenpen": cfg.decode.lenpen, "max_len_a": cfg.decode.max_len_a, "max_len_b": cfg.decode.max_len_b},
        "limits": {
            "max_lines": options.max_lines,
            "max_chars": options.max_chars,
            "max_beam": options.max_beam,
            "max_queue": options.max_queue,
            "max_src_tokens": tr.max_src_tokens,
            "batch_tokens": b.batch_tokens,
            "batch_wait_ms": options.batch_wait_ms,
        },
        "stats": {"requests": b.requests, "batches": b.batches, "lines": b.lines, "rejected": b.rejected, "waiting": b.waiting},
    }
