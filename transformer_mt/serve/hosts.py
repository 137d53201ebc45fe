"""Which ``Host`` a server answers: a pure ASGI guard against DNS rebinding.

A web page the user visits can point its own name at 127.0.0.1 (DNS rebinding) and then read, as its own
origin, whatever a server on the user's machine answers; the browser still sends the page's name in the
``Host`` header. A server that answers only the names it is reached by (its bound address; the loopback
names for a loopback or wildcard bind; the names its operator allowed) refuses those requests with 421.

No framework here: `tmt serve` and `tmt explore` both wrap their apps in :class:`HostGuard`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from transformer_mt.serve.errors import ServeError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANY = "*"  # --allowed-host '*': any Host (behind a proxy that checks it)
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("", "0.0.0.0", "::")
# A Host value as clients send it: a DNS name, an IPv4 address or a bracketed IPv6 one, then an optional port.
HOST_VALUE = re.compile(r"(?:[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_.])?|\[[0-9a-f:.]{2,45}\])(?::[0-9]{1,5})?")


def allowed_hosts(host: str, port: int, extra: Sequence[str] = ()) -> frozenset[str]:
    """The ``Host`` values a server bound at ``host``:``port`` answers, plus ``extra`` (--allowed-host).

    Each value is ``name:port``, or a bare ``name``, which a Host of that name with any port (or none) matches.
    A loopback bind answers the loopback names (localhost, 127.0.0.1, [::1]) with its port; so does a wildcard
    bind (0.0.0.0, ::), because the names other machines reach it by cannot be known here: give them in
    ``extra``. Port 80 adds the bare names too (clients leave the default port out); port 0 (the kernel picks
    one) gives bare names only. ``"*"`` in ``extra`` means any Host (see :class:`HostGuard`)."""
    names = _bound_names(host)
    values = {name if port == 0 else f"{name}:{port}" for name in names}
    if port == 80:
        values.update(names)
    values.update(_checked(value) for value in extra)
    return frozenset(values)


class HostGuard:
    """Refuses an http or websocket request whose ``Host`` header is not in ``allowed`` (421, JSON
    ``{"error": ...}``) before the app sees it. ``allowed``: from :func:`allowed_hosts`; None or one holding
    ``"*"`` lets any Host through. Lifespan messages pass through."""

    def __init__(self, app: ASGIApp, *, allowed: frozenset[str] | None):
        self.app = app
        self.allowed = None if allowed is None or ANY in allowed else frozenset(value.lower() for value in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = [value for name, value in scope.get("headers", ()) if name == b"host"]
        if len(given) == 1 and self._answers(given[0].decode("latin-1").strip().lower()):
            await self.app(scope, receive, send)
            return
        shown = (
            _quote(given[0].decode("latin-1"))
            if len(given) == 1
            else "missing"
            if not given
            else "given more than once"
        )
        message = (
            f"Host {shown}: not a name this server answers (DNS rebinding is refused); send one of "
            f"{', '.join(sorted(self.allowed))}, or start the server with --allowed-host NAME (repeatable; '*' for "
            "any, behind a proxy that checks Host)"
        )
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 421, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):  # the server can answer the handshake with HTTP
            await send({"type": "websocket.http.response.start", "status": 421, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})  # 1008: policy violation

    def _answers(self, value: str) -> bool:
        assert self.allowed is not None
        if value in self.allowed:
            return True
        name = value[: value.index("]") + 1] if value.startswith("[") and "]" in value else value.rsplit(":", 1)[0]
        return name in self.allowed  # a bare name in the set: any port


def _bound_names(host: str) -> tuple[str, ...]:
    """The names a client uses for a bind address, as a Host header writes them (IPv6 in brackets)."""
    name = host.strip().lower().removeprefix("[").removesuffix("]")
    if name in WILDCARDS or name == "localhost":
        return LOOPBACK
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return (name,)  # a host name: the one its clients use (no DNS lookup here)
    spelled = f"[{address.compressed}]" if address.version == 6 else address.compressed
    return tuple(dict.fromkeys((spelled, *LOOPBACK))) if address.is_loopback else (spelled,)


def _checked(value: str) -> str:
    """An --allowed-host value, lowercased; ServeError when it is not a Host value (a URL, a path, spaces)."""
    norm = value.strip().lower()
    if norm == ANY or HOST_VALUE.fullmatch(norm):
        return norm
    raise ServeError(
        f"--allowed-host {_quote(value)}: not a host name; give it as clients send it in the Host header, "
        "such as example.com or example.com:8443 (no scheme, no path), or '*' for any"
    )


def _quote(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")
