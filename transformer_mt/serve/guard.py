"""The ASGI middleware in front of the API: keys, the body limit, the request deadline, client disconnects
and the per-request metrics, for every request before FastAPI sees it.

Pure ASGI (no framework): it counts the ``http.request`` messages' bytes as they arrive, so a chunked
body, which has no Content-Length, is refused as soon as it passes the limit (413) instead of being read
whole. The body is then handed on in one message; a task listens for the client's disconnect meanwhile
and calls the callbacks the handler registered in the scope (:func:`on_disconnect`), which drop its job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from transformer_mt.serve.batching import Arrivals
from transformer_mt.serve.metrics import ServeMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEADLINE = "tmt.deadline"  # scope key: time.monotonic() by which the answer is due (inf: no --timeout)
DISCONNECT = "tmt.on_disconnect"  # scope key: callbacks to run when the client goes away
GONE = "tmt.gone"  # scope key: True once the client has disconnected
ARRIVING = "tmt.arriving"  # scope key: True while this request counts in Arrivals
# After the limit is passed, read (and discard) up to this much more before answering, so a client that
# sent a little too much is still reading when the 413 comes, rather than meeting a reset connection.
DRAIN_BYTES = 1 << 20


def deadline_of(scope: Scope) -> float:
    return scope.get(DEADLINE, math.inf)


def arrived(scope: Scope, arrivals: Arrivals) -> None:
    """This request was submitted (or refused): it no longer counts as arriving."""
    if scope.get(ARRIVING):
        scope[ARRIVING] = False
        arrivals.count -= 1


def on_disconnect(scope: Scope, callback: Callable[[], None]) -> None:
    """Run ``callback`` if the client disconnects before the answer is sent (at once if it already has)."""
    if scope.get(GONE):
        callback()
        return
    scope.setdefault(DISCONNECT, []).append(callback)


async def send_json(send: Send, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class Guard:
    """Wraps the app: API keys (401), the raw body cap (413) and its arrival deadline (408), metrics."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        timeout: float,
        keys: tuple[str, ...],
        open_paths: tuple[str, ...],
        metrics: ServeMetrics,
        arrivals: Arrivals,
    ):
        self.app, self.max_body, self.timeout, self.arrivals = app, max_body, timeout, arrivals
        self.keys = [k.encode() for k in keys]
        self.open_paths, self.metrics = open_paths, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        tic = time.perf_counter()
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if scope.get("method") == "POST":  # a translation on its way: idle workers wait for it to join their batch
            scope[ARRIVING] = True
            self.arrivals.count += 1
        try:
            await self._handle(scope, receive, counted)
        finally:
            arrived(scope, self.arrivals)
            if status:  # 0: the client left before any answer
                self.metrics.request(scope.get("path", ""), status, time.perf_counter() - tic)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[DEADLINE] = time.monotonic() + self.timeout if self.timeout > 0 else math.inf
        if self.keys and scope.get("path") not in self.open_paths and not self._authorized(scope):
            message = "missing or unknown API key; send the header 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
            await send_json(send, 401, {"error": message}, {"WWW-Authenticate": "Bearer"})
            return
        if scope.get("method") != "POST":  # the API reads no other body: nothing to count, nothing to wait for
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:  # answered already (413, 408) or the client left
            return
        gone = asyncio.Event()
        listener = asyncio.create_task(self._listen(receive, scope, gone))
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()  # only the listener reads the server's receive from here on
            return {"type": "http.disconnect"}

        try:
            await self.app(scope, replay, send)
        finally:
            listener.cancel()

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
            elif name == b"x-api-key":
                given = value.strip()
        # Compare with every key in constant time: how long it takes says nothing about which key was close.
        return bool(given) and sum(hmac.compare_digest(given, key) for key in self.keys) > 0

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, counted as it arrives; None after answering 413 / 408, or when the client left."""
        chunks, size, more = [], 0, True
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        too_big = declared.isdigit() and int(declared) > self.max_body
        deadline = deadline_of(scope)
        try:
            while more and (not too_big or size <= self.max_body + DRAIN_BYTES):
                left = None if math.isinf(deadline) else max(0.0, deadline - time.monotonic())
                message = await asyncio.wait_for(receive(), left)
                if message["type"] == "http.disconnect":
                    return None
                data, more = message.get("body", b""), message.get("more_body", False)
                size += len(data)
                too_big = too_big or size > self.max_body
                if not too_big:
                    chunks.append(data)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            if too_big:  # the limit was passed anyway: say that, not the deadline
                await self._refuse_size(send, size)
                return None
            await send_json(send, 408, {"error": f"the request body did not arrive within --timeout {self.timeout:g} s; send it at once"})
            return None
        if too_big:
            await self._refuse_size(send, max(size, int(declared or 0)))
            return None
        return b"".join(chunks)

    async def _refuse_size(self, send: Send, size: int) -> None:
        message = f"body: more than {self.max_body} bytes ({size} or more), more than this server's limits allow (--max-lines x --max-chars); split the request"
        await send_json(send, 413, {"error": message})

    async def _listen(self, receive: Receive, scope: Scope, gone: asyncio.Event) -> None:
        """Wait for the server's next message: a disconnect (the client left, or the answer was sent)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            scope[GONE] = True
            for callback in scope.get(DISCONNECT, ()):
                callback()
