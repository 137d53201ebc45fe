"""What POST /translate accepts and how a refusal reads: the request schema, its checks and error answers.

Imported only after fastapi (which brings pydantic) was found. User mistakes are :class:`ApiError`
(status + one line naming the field and the fix).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from transformer_mt.config import beam_problem, lenpen_problem
from transformer_mt.decoding import TextTranslator
from transformer_mt.serve import ServeOptions


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


def decode_settings(tr: TextTranslator, req: TranslateRequest, options: ServeOptions) -> tuple[int, float]:
    """The request's beam and lenpen (the checkpoint's when absent), checked before the request is queued:
    beam within --max-beam and the target vocabulary, 1 <= nbest <= beam, lenpen within config.lenpen_problem's bound."""
    beam, lenpen = tr.decode_defaults(req.beam, req.lenpen)
    problem = beam_problem(beam, req.nbest, tgt_vocab_size=tr.tgt_tok.vocab_size, limit=options.max_beam) or lenpen_problem(lenpen)
    if problem:
        raise ApiError(422, f"{problem.key}: {problem.value} {problem.reason}")
    return beam, lenpen


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
            raise ApiError(413, f"text[{i}]: {len(line)} characters, more than --max-chars {options.max_chars}; split the line")
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as exc:  # JSON's "\ud800": a lone surrogate, which no tokenizer can encode
                raise ApiError(
                    422, f"text[{i}]: is not valid Unicode (a lone surrogate \\u{ord(line[exc.start]):04x} at character {exc.start}); send whole characters"
                ) from None


def describe_validation(errors: Sequence[dict]) -> tuple[int, str]:
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
