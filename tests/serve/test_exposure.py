"""`tmt serve` against requests made to hurt it, in this process (uvicorn on a loopback port): bodies of
millions of tiny JSON values, bodies sent where none is read, many bodies held at once, and a Host header
that is not the server's (DNS rebinding). Each must be answered 4xx/5xx JSON at once while /health keeps
answering within a second; the server's memory must stay near the size of what it was sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.conftest import run_cli
from tests.serve.conftest import serving
from transformer_mt.serve import ServeOptions

if TYPE_CHECKING:
    import httpx
else:
    httpx = pytest.importorskip("httpx")

MB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Growth:
    bytes: int = 0


@contextmanager
def rss_growth():
    """How far this process's resident memory rose above its level at the start: sampled every 10 ms, and
    the kernel's peak (ru_maxrss) when the block set a new one (a sampler starved of the GIL misses nothing)."""
    start, peak_before = _rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    growth, highest, done = Growth(), [start], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            highest.append(_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield growth
    finally:
        done.set()
        sampler.join(10)
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        growth.bytes = max(max(highest), peak_after if peak_after > peak_before else 0) - start


async def _while_probing(url: str, send) -> tuple[httpx.Response, list[int]]:
    """Run ``send(client)`` while /health is asked every 50 ms, each answer due within 1 s (else httpx raises)."""
    codes: list[int] = []
    async with httpx.AsyncClient(base_url=url) as client:
        task = asyncio.create_task(send(client))
        for _ in range(2000):  # bounded; ends with the request
            codes.append((await client.get("/health", timeout=1.0)).status_code)
            if task.done():
                break
            await asyncio.sleep(0.05)
        return await task, codes


def _json_post(body: bytes):
    async def send(client):
        return await client.post("/translate", content=body, headers={"Content-Type": "application/json"}, timeout=120)

    return send


# --- lists of millions of tiny values: bounded before the JSON is parsed or validated item by item ---

OPTIONS = ServeOptions()  # the default limits: a body cap of about 30 MB


@pytest.mark.parametrize(
    "body",
    [
        b'{"text": [' + b"0," * 2_999_999 + b"0]}",  # 3 million integers, 6 MB
        b'{"text": [' + b'"",' * ((OPTIONS.max_body_bytes - 16) // 3) + b'""]}',  # empty lines up to the byte cap
    ],
    ids=["3M-integers", "empty-lines-at-the-cap"],
)
def test_a_list_of_millions_is_refused_while_health_answers(translator, body):
    assert len(body) <= OPTIONS.max_body_bytes
    with serving(translator, OPTIONS) as (url, served), rss_growth() as growth:
        answer, health = asyncio.run(_while_probing(url, _json_post(body)))
        assert httpx.post(f"{url}/translate", json={"text": "A dog."}, timeout=30).status_code == 200
    assert answer.status_code == 413, answer.text[:300]
    error = answer.json()["error"]
    assert "--max-lines 256" in error and len(error) < 300 and "\n" not in error
    assert health and set(health) == {200}
    assert served.batcher.requests == 1  # only the good request was queued
    assert growth.bytes < 300 * MB, f"the server grew by {growth.bytes / MB:.0f} MB"


def test_the_first_item_that_is_not_a_string_is_named_once(translator):
    options = ServeOptions(max_lines=256)
    text = ["A man."] * 5 + [7] * 250 + [None]
    with serving(translator, options) as (url, _):
        r = httpx.post(f"{url}/translate", json={"text": text}, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 422 and error.startswith("text[5]: ") and "string" in error and len(error) < 200


def test_json_nested_too_deep_is_a_400(translator):
    with serving(translator, ServeOptions()) as (url, _):
        r = httpx.post(
            f"{url}/translate",
            content=b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code in (400, 413) and len(r.json()["error"]) < 300, r.text[:300]
        assert httpx.get(f"{url}/health").status_code == 200


# --- bodies: none read where none is taken, the key before any byte, a budget across connections ---

KEY = "a-key-for-the-tests-0123456789"


def _raw(port: int, head: bytes, body: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head + body)
    return s


def _head(method: str, path: str, port: int, length: int, *extra: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(s: socket.socket) -> tuple[int, dict, bytes]:
    """The status, headers and body of the answer on ``s`` (its socket timeout bounds the wait)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        assert chunk
        rest += chunk
    return int(status_line.split()[1]), headers, rest


@pytest.mark.parametrize(
    "method, path", [("POST", "/health"), ("GET", "/ready"), ("POST", "/nowhere"), ("GET", "/models")]
)
def test_a_body_where_none_is_taken_is_refused_unread(translator, method, path):
    """The client declares 10 MB and sends 1 KB: the answer must come without waiting for the rest."""
    options = ServeOptions(timeout=60, api_keys=(KEY,))
    with serving(translator, options) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with _raw(port, _head(method, path, port, 10 * MB, f"X-API-Key: {KEY}"), b"x" * 1024) as s:
            status, headers, body = _answer(s)
        assert status in (405, 413) and headers["content-type"] == "application/json", (status, body)
        assert "body" in json.loads(body)["error"]
        assert httpx.get(f"{url}/health").json()["body_bytes_held"] == 0


def test_without_a_key_no_body_byte_is_read(translator):
    options = ServeOptions(timeout=60, api_keys=(KEY,))
    with serving(translator, options) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with _raw(port, _head("POST", "/translate", port, 10 * MB), b"x" * 1024) as s:
            status, _, _ = _answer(s)
        assert status == 401 and httpx.get(f"{url}/health").json()["body_bytes_held"] == 0


def test_bodies_held_at_once_are_bounded_across_connections(translator):
    options = ServeOptions(max_lines=4, max_chars=100, timeout=60, batch_wait_ms=0)
    cap = options.max_body_bytes
    options.body_budget = 3 * cap
    with serving(translator, options) as (url, _):
        port = int(url.rsplit(":", 1)[1])

        def held() -> int:
            return httpx.get(f"{url}/health").json()["body_bytes_held"]

        stalled = []
        for k in range(1, 4):  # three bodies at the cap, all but their last byte sent: within the budget
            stalled.append(_raw(port, _head("POST", "/translate", port, cap), b" " * (cap - 1)))
            for _ in range(1000):
                if held() == k * (cap - 1):
                    break
                time.sleep(0.01)
            assert held() == k * (cap - 1)
        with _raw(port, _head("POST", "/translate", port, cap), b" " * (cap - 1)) as fourth:
            status, headers, body = _answer(fourth)
        assert status == 503 and headers["retry-after"] == "1" and "--body-budget-mb" in json.loads(body)["error"]
        assert held() == 3 * (cap - 1)
        stalled.pop().close()  # a client goes: its bytes are let go
        for _ in range(1000):
            if held() == 2 * (cap - 1):
                break
            time.sleep(0.01)
        assert httpx.post(f"{url}/translate", json={"text": "A dog."}, timeout=30).status_code == 200
        for s in stalled:
            s.close()


def test_a_body_budget_below_one_body_is_refused():
    from transformer_mt.serve import ServeError

    options = ServeOptions(max_lines=4, max_chars=100)
    options.body_budget = options.max_body_bytes - 1
    with pytest.raises(ServeError, match="--body-budget-mb"):
        options.check()


# --- the Host header ---


def test_a_foreign_host_is_refused_and_the_served_ones_answer(translator):
    with serving(translator, ServeOptions(batch_wait_ms=0)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 200, host
        r = httpx.post(f"{url}/translate", json={"text": "A man."}, headers={"Host": f"rebound.example:{port}"})
        assert (
            r.status_code == 421 and f"localhost:{port}" in r.json()["error"] and "--allowed-host" in r.json()["error"]
        )
        assert httpx.get(f"{url}/health", headers={"Host": "rebound.example"}).status_code == 421


def test_an_allowed_host_that_is_not_a_name_is_one_line_before_loading(capsys):
    code, _, err = run_cli(["serve", "-c", "no-such.pt", "--allowed-host", "https://mt.example.org/"], capsys)
    assert (
        code == 2
        and err.strip().startswith("tmt: error: --allowed-host 'https://mt.example.org/': not a host name")
        and err.count("\n") == 1
    )


@pytest.mark.slow
def test_the_allowed_host_option_reaches_the_server(random_checkpoint):
    from tests.serve.test_serve import running_server

    with running_server("-c", str(random_checkpoint), "--allowed-host", "mt.example.org") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/health", headers={"Host": "mt.example.org"}).status_code == 200
        assert httpx.get(f"{url}/health", headers={"Host": f"127.0.0.1:{port}"}).status_code == 200
        r = httpx.get(f"{url}/health", headers={"Host": f"other.example:{port}"})
        assert r.status_code == 421 and "mt.example.org" in r.json()["error"]


# --- the bound on JSON tokens, against a count made from the parsed value ---


def _tokens(value) -> int:
    """The JSON tokens of ``value`` written out: values, keys, and the punctuation between them."""
    if isinstance(value, list):
        return 2 + sum(map(_tokens, value)) + max(len(value) - 1, 0)
    if isinstance(value, dict):
        return 2 + sum(2 + _tokens(v) for v in value.values()) + 2 * len(value) - 1 if value else 2
    return 1


def _random_value(rng, depth: int = 0):
    """Nested lists and objects of strings full of quotes, backslashes and punctuation, numbers and literals."""
    kind = rng.randrange(6 if depth < 4 else 3)
    if kind == 0:
        return "".join(
            rng.choice(['"', "\\", ",", ":", "[", "]", "{", "}", "a", " ", "\u00e9", "\U0001f600", "\\\\", '\\"'])
            for _ in range(rng.randrange(12))
        )
    if kind == 1:
        return rng.choice([0, -1.5e3, 12345, True, False, None])
    if kind == 2:
        return rng.choice(["", "A man, a plan: [a canal] {Panama}"])
    if kind in (3, 4):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {
        "k" + str(i) + rng.choice(["", ",", ":", '"']): _random_value(rng, depth + 1) for i in range(rng.randrange(5))
    }


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_the_token_bound_is_never_below_the_tokens_json_reads(ensure_ascii):
    import random

    from transformer_mt.serve.schema import more_tokens_than

    rng = random.Random(7)
    for _ in range(500):
        value = _random_value(rng)
        body = json.dumps(value, ensure_ascii=ensure_ascii, separators=rng.choice([(",", ":"), (", ", ": ")])).encode()
        assert not more_tokens_than(body, 2 * _tokens(value) + 1), body  # a bound of at most 2 per token, + 1
        assert more_tokens_than(body, _tokens(value) - 1), body  # and never below the count


def test_a_request_at_the_limits_full_of_punctuation_is_within_the_token_bound():
    from transformer_mt.serve.schema import more_tokens_than, token_limit

    options = ServeOptions(max_lines=256, max_chars=100)
    line = 'He said: "[a, b]" {c} \\ d,' * 3
    body = json.dumps({"text": [line[:100]] * 256, "model": "m", "beam": 5, "lenpen": 1.0, "nbest": 2}).encode()
    assert not more_tokens_than(body, token_limit(options) - 10_000)
