"""The ASGI middleware in front of the API: keys, the body limits, the request deadline, client disconnects
and the per-request metrics, for every request before FastAPI sees it.

Pure ASGI (no framework). Nothing of a body is read before the API key in the headers is checked, and only
the paths that take a body (POST /translate) read one: any other request that declares a body is refused
unread (413). A body is counted as its ``http.request`` messages arrive, so a chunked one, which has no
Content-Length, is refused as soon as it passes the cap (413) instead of being read whole; and the bytes
held by all requests together are bounded by a :class:`BodyBudget` (503 past it), so many connections
cannot pin many bodies at the cap. The body is then handed on in one message; a task listens for the
client's disconnect meanwhile and calls the callbacks the handler registered in the scope
(:func:`on_disconnect`), which drop its job.
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


def _declares_body(scope: Scope) -> bool:
    """The request head announces a body: a Content-Length above 0, or a Transfer-Encoding (chunked)."""
    headers = dict(scope.get("headers", ()))
    length = headers.get(b"content-length", b"0").strip()
    return b"transfer-encoding" in headers or not (length.isdigit() and int(length) == 0)


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


class BodyBudget:
    """Bytes of request bodies held at once, all connections together: from their first byte read to their
    answer. Changed on the event loop only."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes if the budget has room for them; False (nothing taken) if not."""
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class Guard:
    """Wraps the app: API keys (401), bodies only where taken (413), the raw body cap (413) and its arrival
    deadline (408), the budget of all bodies held (503), metrics."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        timeout: float,
        keys: tuple[str, ...],
        open_paths: tuple[str, ...],
        body_paths: tuple[str, ...],
        budget: BodyBudget,
        metrics: ServeMetrics,
        arrivals: Arrivals,
    ):
        self.app, self.max_body, self.timeout, self.arrivals = app, max_body, timeout, arrivals
        self.keys = [k.encode() for k in keys]
        self.open_paths, self.body_paths, self.budget, self.metrics = open_paths, body_paths, budget, metrics

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

        if self._takes_body(scope):  # a translation on its way: idle workers wait for it to join their batch
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
        if not self._takes_body(
            scope
        ):  # the API reads no other body: refuse one unread, else nothing to count or wait for
            if _declares_body(scope):
                asked = f"{scope.get('method')} {scope.get('path', '')}"
                asked = asked if len(asked) <= 60 else asked[:60] + "..."
                message = (
                    f"{asked}: takes no request body; send it without one "
                    f"(only POST {', '.join(self.body_paths)} reads a body)"
                )
                await send_json(send, 413, {"error": message})
                return
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:  # answered already (413, 408, 503) or the client left
            return
        try:
            await self._forward(scope, receive, send, body)
        finally:
            self.budget.give(len(body))

    async def _forward(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        """Run the app on ``body``, in one message, while a task listens for the client's disconnect."""
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

    def _takes_body(self, scope: Scope) -> bool:
        return scope.get("method") == "POST" and scope.get("path") in self.body_paths

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
        """The whole body, counted as it arrives and held within the budget (the caller gives ``len(body)``
        back when done with it); None after answering 413 / 408 / 503, or when the client left."""
        chunks: list[bytes] = []
        try:
            complete = await self._receive_body(scope, receive, send, chunks)
        except BaseException:  # cancelled: the server is stopping
            self.budget.give(sum(map(len, chunks)))
            raise
        if not complete:
            self.budget.give(sum(map(len, chunks)))
            return None
        return b"".join(chunks)

    async def _receive_body(self, scope: Scope, receive: Receive, send: Send, chunks: list[bytes]) -> bool:
        """Append the body's chunks to ``chunks``, each taken from the budget first; False after answering
        413 / 408 / 503, or when the client left."""
        size, more = 0, True
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        too_big = declared.isdigit() and int(declared) > self.max_body
        deadline = deadline_of(scope)
        try:
            while more and (not too_big or size <= self.max_body + DRAIN_BYTES):
                left = None if math.isinf(deadline) else max(0.0, deadline - time.monotonic())
                message = await asyncio.wait_for(receive(), left)
                if message["type"] == "http.disconnect":
                    return False
                data, more = message.get("body", b""), message.get("more_body", False)
                size += len(data)
                if size > self.max_body and not too_big:  # over the cap: the rest is counted, never kept
                    too_big = True
                    self.budget.give(sum(map(len, chunks)))
                    chunks.clear()
                if too_big or not data:
                    continue
                if not self.budget.take(len(data)):
                    budget_mb = self.budget.limit / (1 << 20)
                    refusal = (
                        f"the server holds {self.budget.held} bytes of request bodies, all its --body-budget-mb "
                        f"{budget_mb:.4g} allows; retry shortly"
                    )
                    await send_json(send, 503, {"error": refusal}, {"Retry-After": "1"})
                    return False
                chunks.append(data)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            if too_big:  # the limit was passed anyway: say that, not the deadline
                await self._refuse_size(send, size)
                return False
            await send_json(
                send,
                408,
                {"error": f"the request body did not arrive within --timeout {self.timeout:g} s; send it at once"},
            )
            return False
        if too_big:
            await self._refuse_size(send, max(size, int(declared or 0)))
            return False
        return True

    async def _refuse_size(self, send: Send, size: int) -> None:
        message = (
            f"body: more than {self.max_body} bytes ({size} or more), more than this server's limits allow "
            "(--max-lines x --max-chars); split the request"
        )
        await send_json(send, 413, {"error": message})

    async def _listen(self, receive: Receive, scope: Scope, gone: asyncio.Event) -> None:
        """Wait for the server's next message: a disconnect (the client left, or the answer was sent)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            scope[GONE] = True
            for callback in scope.get(DISCONNECT, ()):
                callback()
