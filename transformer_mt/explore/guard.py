"""The body cap of `tmt explore`: a request's body is counted as it arrives and refused (413) once it passes the
cap, or (408) when it does not arrive in time, before FastAPI parses it. Pure ASGI, like `tmt serve`'s guard.

Every explore request is one or two sentences and a few settings, so the cap follows from --max-chars; a page on
localhost can still be sent anything by any other process or page, and without a cap a body is read whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SENTENCE_FIELDS = 3  # text, reference, batch_with: the most sentences one request carries
JSON_BYTES_PER_CHAR = 12  # a character written as a surrogate pair of \uXXXX escapes, JSON's longest form
OVERHEAD = 4096  # the settings and the JSON around the sentences


def body_cap(max_chars: int) -> int:
    """The most bytes a request within --max-chars can take, in any valid JSON spelling."""
    return SENTENCE_FIELDS * max_chars * JSON_BYTES_PER_CHAR + OVERHEAD


class BodyCap:
    """Reads a request's body into memory up to ``max_bytes`` within ``timeout`` seconds, then hands it on;
    more -> 413, too slow -> 408, both as ``{"error": ...}`` without reading the rest."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout: float = 10.0):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _refuse(
                send,
                413,
                f"body: more than {self.max_bytes:,} bytes, the most a request within --max-chars needs; "
                "send one sentence",
            )
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except asyncio.TimeoutError:
            await _refuse(send, 408, f"body: did not arrive within {self.timeout:g} s; send the request at once")
            return
        if body is None:  # over the cap while it arrived (a chunked body announces no length)
            await _refuse(
                send,
                413,
                f"body: more than {self.max_bytes:,} bytes, the most a request within --max-chars needs; "
                "send one sentence",
            )
            return
        handed = False

        async def replay() -> Message:
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the cap."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return bytes(body)
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return None
            if not message.get("more_body", False):
                return bytes(body)


async def _refuse(send: Send, status: int, error: str) -> None:
    data = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
