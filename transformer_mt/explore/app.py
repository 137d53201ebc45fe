"""The FastAPI application of `tmt explore`: the page, its script and style, and the JSON endpoints it calls.

Imported only after fastapi was found (``transformer_mt.explore.server.require_fastapi``). Every endpoint is
documented in the OpenAPI page (/docs), so a notebook can call them too:

- ``GET /api/checkpoints``: the loaded checkpoints by name (never their paths), architecture and decode defaults;
- ``GET /api/examples``: the example sentences (``--examples``, else the checkpoint's validation source);
- ``POST /api/translate``: the translation, each piece's probability and its top alternatives;
- ``POST /api/beam``: beam search step by step, the n-best, the winner and why;
- ``POST /api/attention``: `tmt attention`'s JSON (with ``reference``: teacher-forced) and the per-token loss;
- ``POST /api/anatomy``: masks, shapes (as `tmt inspect`) and positional encodings of the batch.

Errors are ``{"error": "one line"}``: 404 an unknown checkpoint or path, 413 a sentence over the limits, 422
an empty sentence, a bad field or setting. The model work runs one request at a time (a lock): the shape
recording of /api/anatomy hooks the shared model's modules while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from transformer_mt import runtime
from transformer_mt.errors import TmtError
from transformer_mt.explore.analysis import attention_view, run_search, translation_view
from transformer_mt.explore.anatomy import anatomy_view
from transformer_mt.explore.session import Explorer, RequestError
from transformer_mt.explore.trace import beam_view
from transformer_mt.text import tagged, target_languages

STATIC = Path(__file__).resolve().parent / "static"


class SentenceRequest(BaseModel):
    """One source sentence and the search settings. Strict types: "5" is not a beam."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(description="The source sentence (one line).")
    checkpoint: str | None = Field(
        None, description="A loaded checkpoint's name (GET /api/checkpoints); default: the first."
    )
    beam: int | None = Field(None, description="Beam size, 1 = greedy; default: the checkpoint's decode.beam.")
    lenpen: float | None = Field(
        None, allow_inf_nan=False, description="GNMT length penalty alpha; default: the checkpoint's decode.lenpen."
    )
    tgt_lang: str | None = Field(
        None,
        description="The target language of a multilingual checkpoint (GET /api/checkpoints lists its languages); "
        "the source then starts with its tag, <2fr>.",
    )


class AttentionRequest(SentenceRequest):
    reference: str | None = Field(
        None, description="Teacher-force this target instead of the model's translation (tmt attention --ref)."
    )


class AnatomyRequest(AttentionRequest):
    batch_with: str | None = Field(
        None, description="A second source sentence batched with the first (translated), so the shorter one is padded."
    )


class Alternative(BaseModel):
    id: int
    piece: str
    prob: float


class TokenRow(BaseModel):
    """One decoder position: the piece it produced (the target's, then </s>), how probable it was, and the
    alternatives."""

    id: int
    piece: str
    logprob: float
    prob: float
    loss: float = Field(description="-log p of this piece (nats, no label smoothing).")
    alternatives: list[Alternative] = Field(
        description="The most probable pieces at this position, best first (the chosen one included)."
    )
    in_output: bool | None = Field(
        None,
        description="Whether the search generated this piece: False for the </s> row of an output cut at the "
        "longest length.",
    )


class TranslateResponse(BaseModel):
    checkpoint: str
    translation: str = Field(description="tmt translate's output for this sentence and settings.")
    score: float = Field(description="log-prob / GNMT length penalty, the search's ranking score.")
    logprob: float
    ended_with_eos: bool
    beam: int
    lenpen: float
    src_pieces: list[str]
    tokens: list[TokenRow]
    time_ms: float


class BeamResponse(BaseModel):
    checkpoint: str
    translation: str
    beam: int
    lenpen: float
    steps: list[dict[str, Any]] = Field(
        description="Per step: open (tokens, logprob, from_beam, appended), finished (tokens, logprob, length, "
        "penalty, score, eos, new), done, reason."
    )
    winner: dict[str, Any] = Field(
        description="tokens, logprob, score, why, and the n-best (tokens, logprob, score, length)."
    )
    time_ms: float


def build_app(explorer: Explorer) -> FastAPI:
    app = FastAPI(
        title="tmt explore",
        summary="A Transformer translation model at work on one sentence: translation, beam search, attention, masks.",
    )
    _add_errors(app)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/checkpoints")
    def checkpoints() -> dict:
        """The loaded checkpoints, by name (never their paths), with their architecture and decode defaults; the
        first is the default."""
        described = [describe_checkpoint(n, tr) for n, tr in explorer.translators.items()]
        return {"default": explorer.default, "checkpoints": described, "limits": vars(explorer.limits)}

    @app.get("/api/examples")
    def examples() -> dict:
        """Example source sentences: the --examples file, else the first checkpoint's validation source if present,
        else none."""
        return {"file": explorer.examples_name, "sentences": explorer.examples}

    _add_sentence_routes(app, explorer)
    return app


def _add_errors(app: FastAPI) -> None:
    """Every refusal as {"error": one line} with its status."""

    @app.exception_handler(RequestError)
    async def _refused(_request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": describe_validation(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = (
            "no such path; the page is at /, the API under /api (docs: /docs)"
            if exc.status_code == 404
            else str(exc.detail)
        )
        return JSONResponse({"error": message}, status_code=exc.status_code)


def _add_sentence_routes(app: FastAPI, explorer: Explorer) -> None:
    """The endpoints that run the model on one sentence; checks first (4xx), then the work, one request at a time on
    one thread. One thread, not each request's own: torch's CPU threads are per thread (OpenMP), and a team of
    ``explorer.threads`` for every server thread that ever ran the model would outnumber the cores, after which
    OpenMP stops spinning between parallel regions and every small matmul waits for its threads to wake up."""
    setup = (lambda: runtime.set_threads(explorer.threads)) if explorer.threads else None
    model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tmt-explore-model", initializer=setup)

    def timed(fn: Callable[[], dict]) -> tuple[dict, float]:
        tic = time.perf_counter()
        return fn(), time.perf_counter() - tic

    def compute(req: SentenceRequest, fn: Callable[[], dict]) -> dict:
        try:
            out, seconds = model_thread.submit(timed, fn).result()
        except RequestError:
            raise
        except TmtError as exc:  # a setting the library refuses (VizError, SearchError): the user's to fix
            raise RequestError(422, str(exc)) from None
        return {"checkpoint": req.checkpoint or explorer.default, **out, "time_ms": round(1000 * seconds, 1)}

    @app.post("/api/translate", response_model=TranslateResponse)
    def translate(req: SentenceRequest) -> dict:
        """The translation of one sentence (tmt translate's, same beam and lenpen) with each piece's probability and
        top alternatives."""
        tr = explorer.translator(req.checkpoint)
        beam, lenpen = explorer.settings(tr, req.beam, req.lenpen)
        src_ids = explorer.sentence(tr, req.text, tags=explorer.language(tr, req.tgt_lang))
        return compute(req, lambda: translation_view(tr, src_ids, beam=beam, lenpen=lenpen, topk=explorer.limits.topk))

    @app.post("/api/beam", response_model=BeamResponse)
    def beam_trace(req: SentenceRequest) -> dict:
        """Beam search step by step: open and finished hypotheses with raw and length-penalised scores, why it
        stopped, the winner and why."""
        tr = explorer.translator(req.checkpoint)
        beam, lenpen = explorer.settings(tr, req.beam, req.lenpen)
        src_ids = explorer.sentence(tr, req.text, tags=explorer.language(tr, req.tgt_lang))
        return compute(req, lambda: beam_view(tr, src_ids, beam=beam, lenpen=lenpen))

    @app.post("/api/attention")
    def attention(req: AttentionRequest) -> dict:
        """tmt attention's JSON for the sentence: encoder_self (L, H, S, S), decoder_self (L, H, T, T), cross
        (L, H, T, S) as weights[layer][head][query][key] (rows sum to 1; decoder self 0 above the diagonal), the
        pieces of both sides, and ``tokens``: per target position its probability and loss (-log p); ``mean_loss``
        their mean. With ``reference`` the target is teacher-forced (tmt attention --ref), else it is the model's
        translation."""
        tr = explorer.translator(req.checkpoint)
        beam, lenpen = explorer.settings(tr, req.beam, req.lenpen)
        tags = explorer.language(tr, req.tgt_lang)
        explorer.sentence(tr, req.text, tags=tags)
        if req.reference is not None:
            explorer.sentence(tr, req.reference, field_name="reference")
        limits = explorer.limits
        return compute(
            req,
            lambda: attention_view(
                tr,
                tagged([req.text], tags)[0],  # encoded as the tags' ids, then the sentence's
                reference=req.reference,
                beam=beam,
                lenpen=lenpen,
                topk=limits.topk,
                max_weights=limits.max_attention,
            ),
        )

    @app.post("/api/anatomy")
    def anatomy(req: AnatomyRequest) -> dict:
        """The batch of the sentence (and ``batch_with``, padded): src_pad / tgt_pad (True = padding), the attention
        masks the model builds (True = may attend: encoder (B, S), decoder look-ahead + padding (B, T, T), cross
        (B, S)), Q/K/V and score shapes per attention module as tmt inspect records them, and the positional
        encodings of its positions (n, d_model)."""
        tr = explorer.translator(req.checkpoint)
        beam, lenpen = explorer.settings(tr, req.beam, req.lenpen)
        tags = explorer.language(tr, req.tgt_lang)
        srcs = [explorer.sentence(tr, req.text, tags=tags)]
        if req.batch_with is not None:
            srcs.append(explorer.sentence(tr, req.batch_with, field_name="batch_with", tags=tags))
        ref = None if req.reference is None else explorer.sentence(tr, req.reference, field_name="reference")

        def run() -> (
            dict
        ):  # the first sentence's target: the reference, else its translation; a second sentence's: its translation
            tgts = [
                ref if ref is not None and i == 0 else run_search(tr, s, beam=beam, lenpen=lenpen)[0].tokens
                for i, s in enumerate(srcs)
            ]
            return anatomy_view(tr, list(zip(srcs, tgts)))

        return compute(req, run)


def describe_checkpoint(name: str, tr: Any) -> dict:
    m, d = tr.cfg.model, tr.cfg.decode
    return {
        "name": name,
        "encoder_layers": m.encoder_layers,
        "decoder_layers": m.decoder_layers,
        "d_model": m.d_model,
        "heads": m.heads,
        "norm": m.norm,
        "positions": m.positions,
        "parameters": sum(p.numel() for p in tr.model.parameters()),
        "vocab": {"src": tr.src_tok.vocab_size, "tgt": tr.tgt_tok.vocab_size},
        "decode": {"beam": d.beam, "lenpen": d.lenpen, "max_len_a": d.max_len_a, "max_len_b": d.max_len_b},
        "max_src_tokens": tr.max_src_tokens,
        "languages": target_languages(tr.cfg.data),  # several: each request names one (tgt_lang)
    }


def describe_validation(errors: Any) -> str:
    """pydantic's validation errors -> one line naming the field: 'beam: Input should be a valid integer (got "5")'."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return 'malformed JSON; send a JSON object such as {"text": "A man."}'
    e = max(errors, key=lambda err: len(err.get("loc", ())))
    parts = [str(p) for p in e.get("loc", ())[1:]]
    field = ".".join(parts) or "body"
    if field == "body":
        return 'body: not a JSON object; send a JSON object such as {"text": "A man."}'
    if e.get("type") == "extra_forbidden":
        return f"{field}: unknown field; see /docs for the fields"
    if e.get("type") == "missing":
        return f"{field}: missing; it is required"
    got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], (dict, list)) else ""
    return f"{field}: {e.get('msg', 'invalid')}{got}"
