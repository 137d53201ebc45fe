"""What POST /translate accepts and how a refusal reads: the request schema, its checks and error answers.

Imported only after fastapi (which brings pydantic) was found. User mistakes are :class:`ApiError`
(status + one line naming the field and the fix).

The body is parsed here, not by FastAPI, so that its cost is bounded before anything is built from it:
JSON made of millions of tiny values (``[0,0,0,...]``, 2 bytes each) would otherwise become millions of
objects, and as many validation errors, on the event loop. :func:`parse_request` first bounds the number
of JSON tokens (:func:`more_tokens_than`, a few C loops over the bytes) by :func:`token_limit`, then parses,
then checks the number of lines and each line's type and length (:func:`check_text`), and only then lets
pydantic validate the handful of values left.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from email.message import Message
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from transformer_mt.config import beam_problem, lenpen_problem
from transformer_mt.decoding import TextTranslator, Translator, decoder_language_ids
from transformer_mt.errors import TmtError
from transformer_mt.serve.options import ServeOptions
from transformer_mt.text import language_tags as text_language_tags


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
    lenpen: float | None = Field(
        None, allow_inf_nan=False, description="GNMT length penalty alpha; default: decode.lenpen."
    )
    nbest: int = Field(1, description="Hypotheses per line (1..beam); > 1 returns [{text, score}, ...] per line.")
    tgt_lang: str | None = Field(
        None,
        description="The target language (e.g. fr) of a multilingual model, required there (GET /models lists each "
        "model's languages); a model with one target language takes that one or none.",
    )
    src_lang: str | None = Field(
        None,
        description="The source language of an NLLB / M2M100 model by its code (e.g. eng_Latn), required there with "
        "tgt_lang (e.g. fra_Latn); other models take none.",
    )


def decode_settings(tr: TextTranslator, req: TranslateRequest, options: ServeOptions) -> tuple[int, float]:
    """The request's beam and lenpen (the checkpoint's when absent), checked before the request is queued:
    beam within --max-beam and the target vocabulary, 1 <= nbest <= beam, lenpen within config.lenpen_problem's
    bound."""
    beam, lenpen = tr.decode_defaults(req.beam, req.lenpen)
    problem = beam_problem(
        beam, req.nbest, tgt_vocab_size=tr.tgt_tok.vocab_size, limit=options.max_beam
    ) or lenpen_problem(lenpen)
    if problem:
        raise ApiError(422, f"{problem.key}: {problem.value} {problem.reason}")
    return beam, lenpen


def language_tags(tr: TextTranslator, req: TranslateRequest, *, model: str) -> list[str]:
    """The tags the request's lines start with for its ``tgt_lang`` (text.language_tags), checked before the request is
    queued: a language the model does not translate into, a missing one for a multilingual model, or a value that is
    no language code is a 422 naming the field, the model by its served name (never its path) and the fix."""
    if tr.cfg.model.decoder_languages:  # its codes go on both sides instead: language_codes
        return []
    if req.src_lang is not None:
        raise ApiError(
            422,
            f"src_lang: model {model!r} reads no source language (only an NLLB / M2M100 model's sources start with "
            "their language's code); leave it out",
        )
    try:
        return text_language_tags(tr.cfg.data, tr.src_tok, req.tgt_lang, where=f"model {model!r}", option="tgt_lang")
    except TmtError as exc:
        raise ApiError(422, f"{exc} (GET /models lists each model's languages)") from None


def language_codes(tr: TextTranslator, req: TranslateRequest, *, model: str) -> tuple[tuple[int, ...], ...]:
    """An NLLB / M2M100 model's (``model.decoder_languages``) source prefix and forced decoder prefix for the
    request's ``src_lang`` and ``tgt_lang`` (decoding.decoder_language_ids), checked before the request is queued:
    a missing or unknown code is a 422 naming the field and the model's codes. Empty for other models."""
    if not tr.cfg.model.decoder_languages:
        return ()
    if not isinstance(tr, Translator):
        raise ApiError(
            422,
            f"model {model!r}: an NLLB model names its target language on the decoder, which only "
            "tmt's engine decodes; serve it without --engine ctranslate2",
        )
    try:
        src, tgt = decoder_language_ids(tr.cfg.model, tr.tgt_tok, req.tgt_lang, req.src_lang, where=f"model {model!r}")
    except TmtError as exc:
        raise ApiError(422, f"{exc} (GET /models lists each model's languages)") from None
    return tuple(src), tuple(tgt)


TOKEN_MARGIN = 10_000  # tokens past a valid request's most that are parsed anyway, to tell the exact line count


def token_limit(options: ServeOptions) -> int:
    """The most JSON tokens, as :func:`more_tokens_than` bounds them, that :func:`parse_request` parses: a valid
    request counts at most 3 per line (the line, its comma and the comma's bound on a bare value) and 31 more;
    the margin lets a request somewhat over --max-lines be told its count, and costs milliseconds to parse."""
    return 3 * options.max_lines + 32 + TOKEN_MARGIN


def more_tokens_than(body: bytes, limit: int) -> bool:
    """Whether ``json.loads(body)`` might read more than ``limit`` JSON tokens before it returns or fails: an
    upper bound from a few passes of bytes.replace / count / split (C loops, no work per token), counting the
    strings, the punctuation outside them, and the bare values (numbers, true, false, null), of which a valid
    prefix holds at most one more than its punctuation. With JSON's escapes removed (backslash pairs first,
    so that each escape keeps the backslash it belongs to, then escaped quotes), the quotes left open and
    close the strings as json.loads reads them, up to its first error."""
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    strings = (plain.count(b'"') + 1) // 2
    if strings > limit:  # before splitting it into as many pieces
        return True
    outside = plain.split(b'"')[0::2]
    marks = sum(len(piece) - len(piece.translate(None, delete=b",:[]{}")) for piece in outside)
    return strings + 2 * marks + 1 > limit


def parse_request(body: bytes, content_type: str | None, options: ServeOptions) -> TranslateRequest:
    """The body of POST /translate as a request, every limit checked: ApiError 415 (not declared JSON), 413 (more
    JSON values than --max-lines allows, too many lines, a line too long), 400 (not JSON), 422 (the rest)."""
    if not _is_json(content_type):
        raise ApiError(415, 'the body was not sent as JSON; send it with the header "Content-Type: application/json"')
    limit = token_limit(options)
    if more_tokens_than(body, limit):
        raise ApiError(
            413,
            f"body: more than {limit} JSON values, more than a request of --max-lines {options.max_lines} lines "
            "holds; split the request",
        )
    try:  # UTF-8 only (RFC 8259), as the bound above reads the bytes: json.loads would also take UTF-16 and UTF-32
        data = json.loads(body.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f'malformed JSON at character {exc.pos} ({exc.msg}); send a JSON object such as {{"text": "A man."}}'
        ) from None
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text; send JSON encoded as UTF-8") from None
    except RecursionError:
        raise ApiError(400, 'malformed JSON: nested too deep; send a JSON object such as {"text": "A man."}') from None
    except ValueError:  # a number of more than 4300 digits (sys.get_int_max_str_digits)
        raise ApiError(
            400, 'malformed JSON: a number too long to read; send a JSON object such as {"text": "A man."}'
        ) from None
    if not isinstance(data, dict):
        raise ApiError(422, 'body: not a JSON object; send a JSON object such as {"text": "A man."}')
    check_text(data.get("text"), options)
    try:
        return TranslateRequest.model_validate(data)
    except ValidationError as exc:
        raise ApiError(*describe_validation(exc.errors())) from None


def _is_json(content_type: str | None) -> bool:
    """application/json or application/*+json, as FastAPI decides whether a body is JSON."""
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_text(text: object, options: ServeOptions) -> None:
    """The ``text`` field before pydantic sees it: a list's length first, then the type of each item, the
    first wrong one named (one error, whatever the list holds), then :func:`check_lines`. Absent or of
    another type: left to pydantic, which reports one error for it."""
    if isinstance(text, str):
        check_lines([text], options)
    elif isinstance(text, list):
        if len(text) > options.max_lines:
            raise ApiError(
                413, f"text: {len(text)} lines, more than --max-lines {options.max_lines}; split the request"
            )
        wrong = next((i for i, line in enumerate(text) if not isinstance(line, str)), None)
        if wrong is not None:
            raise ApiError(
                422, f"text[{wrong}]: {_json_type(text[wrong])}, not a string; send each line as a JSON string"
            )
        check_lines(text, options)


def _json_type(value: object) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {int: "a number", float: "a number", list: "a list", dict: "an object"}.get(type(value), "a value")


def check_lines(lines: list[str], options: ServeOptions) -> None:
    """The limits on the decoded text: lines per request, characters per line, one line per item, whole characters."""
    if not lines:
        raise ApiError(422, "text: an empty list; send one line or a list of at least one line")
    if len(lines) > options.max_lines:
        raise ApiError(413, f"text: {len(lines)} lines, more than --max-lines {options.max_lines}; split the request")
    for i, line in enumerate(lines):
        if "\n" in line or "\r" in line:
            raise ApiError(422, f"text[{i}]: contains a line break; send one line per list item")
        if len(line) > options.max_chars:
            raise ApiError(
                413, f"text[{i}]: {len(line)} characters, more than --max-chars {options.max_chars}; split the line"
            )
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON's "\ud800": a lone surrogate, which no tokenizer can encode
                raise ApiError(
                    422,
                    f"text[{i}]: is not valid Unicode (a lone surrogate \\u{ord(line[exc.start]):04x} at character "
                    f"{exc.start}); send whole characters",
                ) from None


def describe_validation(errors: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """pydantic's errors for a request object -> (422, one line naming the field)."""
    # A union (text: str | list[str]) reports one error per member; the deepest location is the most specific.
    e = max(errors, key=lambda err: len(err.get("loc", ())))
    parts = [p for p in e.get("loc", ()) if p not in ("str", "list[str]")]  # drop the union member tags
    field = (
        "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(parts)) or "body"
    )
    if field == "body":
        return 422, 'body: not a JSON object; send a JSON object such as {"text": "A man."}'
    if e.get("type") == "extra_forbidden":
        return (
            422,
            f"{_quote(field)}: unknown field; the fields are text, model, beam, lenpen, nbest, tgt_lang, src_lang",
        )
    got = f" (got {_quote(repr(e['input']))})" if "input" in e and not isinstance(e["input"], (dict, list)) else ""
    return 422, f"{field}: {e.get('msg', 'invalid')}{got}"


def _quote(text: str, limit: int = 60) -> str:
    """At most ``limit`` characters of a client's value in an answer."""
    return text if len(text) <= limit else text[:limit] + "..."
