"""The Host check against DNS rebinding: which Host values a bind answers, and HostGuard's answers to the
others (http, websocket, lifespan), as a pure ASGI middleware without a server."""

from __future__ import annotations

import asyncio
import json

import pytest

from transformer_mt.serve import HostGuard, ServeError, allowed_hosts


def test_a_loopback_bind_answers_the_loopback_names_with_its_port():
    expected = {"localhost:8000", "127.0.0.1:8000", "[::1]:8000"}
    assert allowed_hosts("127.0.0.1", 8000) == expected
    assert allowed_hosts("localhost", 8000) == expected
    assert allowed_hosts("::1", 8000) == expected


def test_a_wildcard_bind_answers_loopback_and_the_names_allowed_only():
    assert allowed_hosts("0.0.0.0", 8000, ["MT.example.org"]) == {
        "localhost:8000",
        "127.0.0.1:8000",
        "[::1]:8000",
        "mt.example.org",
    }
    assert allowed_hosts("::", 9000) == {"localhost:9000", "127.0.0.1:9000", "[::1]:9000"}


def test_an_address_bind_answers_that_address():
    assert allowed_hosts("192.168.1.5", 8000) == {"192.168.1.5:8000"}
    assert allowed_hosts("fe80::1", 8000) == {"[fe80::1]:8000"}


def test_port_80_also_answers_the_bare_names():
    assert allowed_hosts("127.0.0.1", 80) >= {"localhost", "localhost:80"}


@pytest.mark.parametrize("bad", ["http://mt.example.org", "mt.example.org/api", "a b", "", "x" * 300])
def test_an_allowed_host_that_is_not_a_host_name_is_refused_in_one_line(bad):
    with pytest.raises(ServeError) as info:
        allowed_hosts("127.0.0.1", 8000, [bad])
    message = str(info.value)
    assert message.startswith("--allowed-host ") and "\n" not in message and len(message) < 300


def _call(allowed: frozenset[str] | None, scope: dict, inbox: list[dict] | None = None) -> tuple[list[dict], bool]:
    """Run a HostGuard of ``allowed`` on one scope; returns (the messages it sent, whether the wrapped app ran)."""
    sent: list[dict] = []
    ran = {"app": False}
    messages = list(inbox or [{"type": "http.request", "body": b"", "more_body": False}])

    async def app(scope, receive, send):
        ran["app"] = True

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(HostGuard(app, allowed=allowed)(scope, receive, send))
    return sent, ran["app"]


def _http(host: bytes | None) -> dict:
    headers = [(b"host", host)] if host is not None else []
    return {"type": "http", "method": "GET", "path": "/health", "headers": headers + [(b"accept", b"*/*")]}


@pytest.mark.parametrize(
    "host", [b"127.0.0.1:8000", b"LOCALHOST:8000", b"[::1]:8000", b"mt.example.org", b"mt.example.org:443"]
)
def test_the_guard_lets_the_allowed_hosts_through(host):
    allowed = allowed_hosts("127.0.0.1", 8000, ["mt.example.org"])
    sent, ran = _call(allowed, _http(host))
    assert ran and not sent


@pytest.mark.parametrize(
    "host", [b"attacker.example:8000", b"127.0.0.1:8001", b"localhost", b"127.0.0.1:8000.evil", None]
)
def test_the_guard_answers_421_json_naming_the_allowed_hosts(host):
    allowed = allowed_hosts("127.0.0.1", 8000)
    sent, ran = _call(allowed, _http(host))
    assert not ran
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 421
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert "\n" not in error and "localhost:8000" in error and "--allowed-host" in error


def test_the_guard_quotes_a_long_host_briefly():
    allowed = allowed_hosts("127.0.0.1", 8000)
    sent, _ = _call(allowed, _http(b"a" * 5000))
    assert len(json.loads(sent[1]["body"])["error"]) < 400


def test_star_or_none_lets_any_host_through():
    for allowed in (None, allowed_hosts("0.0.0.0", 8000, ["*"])):
        sent, ran = _call(allowed, _http(b"anything.example:1"))
        assert ran and not sent


def test_lifespan_passes_through():
    allowed = frozenset({"localhost:8000"})
    _, ran = _call(allowed, {"type": "lifespan"}, [{"type": "lifespan.startup"}])
    assert ran


def test_a_websocket_with_a_foreign_host_is_refused_before_the_app():
    allowed = allowed_hosts("127.0.0.1", 8000)
    scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"attacker.example:8000")]}
    connect = [{"type": "websocket.connect"}]
    sent, ran = _call(allowed, {**scope, "extensions": {"websocket.http.response": {}}}, list(connect))
    assert not ran and sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 421
    assert "--allowed-host" in json.loads(sent[1]["body"])["error"]
    sent, ran = _call(allowed, scope, list(connect))  # a server without the denial-response extension
    assert not ran and sent == [sent[0]] and sent[0]["type"] == "websocket.close" and sent[0]["code"] == 1008
