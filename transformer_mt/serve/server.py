"""uvicorn, configured for exposure: the header timeout, keep-alive, connection cap, header size and a
bounded graceful shutdown.

uvicorn times out idle keep-alive connections but not a request head that arrives slowly: a client that
sends half its headers and stalls holds its connection (and a place under ``limit_concurrency``) for
ever. :func:`guarded_h11` adds that timeout to uvicorn's h11 protocol: from the connection's start, or
the first byte of a later request, the whole head must arrive within ``header_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from transformer_mt.serve.options import ServeOptions

MAX_HEADER_BYTES = 16 * 1024  # a request head larger than this is refused (400) by h11 before it is parsed
HEAD_TIMEOUT_ANSWER = b'{"error": "the request headers did not arrive within --header-timeout; send them at once"}'


def guarded_h11(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's H11Protocol that closes a connection whose request head is not complete in time."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._watch_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
                self._head_timer.cancel()
                self._head_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _watch_head(self) -> None:
            """Armed while a request head is awaited and has begun (or the connection is new); off once it is in."""
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if waiting and self._head_timer is None and (self.cycle is None or self.conn.trailing_data[0]):
                self._head_timer = self.loop.call_later(header_timeout, self._head_too_slow)
            elif not waiting and self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                head = (
                    "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(HEAD_TIMEOUT_ANSWER)}\r\n"
                )
                self.transport.write(head.encode() + b"connection: close\r\n\r\n" + HEAD_TIMEOUT_ANSWER)
                self.transport.close()

    return HeadTimeoutH11Protocol


def build_server(app: Any, options: ServeOptions, *, host: str, port: int, log_level: str = "info") -> Any:
    """A ``uvicorn.Server`` for ``app`` with the limits of ``options`` (run it with ``.run()``, or
    ``.run(sockets=[sock])`` on a socket already bound)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=guarded_h11(options.header_timeout),
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_keep_alive=options.keep_alive_timeout,
        limit_concurrency=options.max_connections,
        timeout_graceful_shutdown=options.shutdown_timeout or None,
        server_header=False,  # no version banner for scanners
        lifespan="on",
    )
    return uvicorn.Server(config)
