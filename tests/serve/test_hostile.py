"""A hostile mix against the in-process server on loopback: 64 concurrent clients of which one request in
ten is malformed or oversized, one huge request, and 50 half-open connections that sent part of their
headers and stalled. Every well-formed request must get exactly the Translator's own translation of its
lines, every bad one its 4xx JSON error, and /ready must answer 200 throughout. Loops are bounded by
counts; nothing asserts a time.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from tests.conftest import head
from tests.serve.conftest import serving
from transformer_mt.serve import ServeOptions

httpx = pytest.importorskip("httpx")

CLIENTS, REQUESTS_EACH, HALF_OPEN = 64, 3, 50
OPTIONS = ServeOptions(max_lines=16, max_chars=300, max_queue=256, batch_wait_ms=2, header_timeout=120, timeout=120)


def bad_request(k: int) -> tuple[dict[str, Any], int, str]:
    """The k-th kind of bad request: (httpx keyword arguments, status, words of the error)."""
    over_cap = b'{"text": "' + b"a" * (OPTIONS.max_body_bytes + 1000) + b'"}'

    async def chunked():
        for start in range(0, len(over_cap), 4096):
            yield over_cap[start : start + 4096]

    kinds: list[tuple[dict[str, Any], int, str]] = [
        ({"content": b'{"text": ["A man', "headers": {"Content-Type": "application/json"}}, 400, "malformed JSON"),
        ({"json": {"text": ["a"] * 17}}, 413, "17 lines, more than --max-lines 16"),
        ({"json": {"text": "b" * 301}}, 413, "text[0]: 301 characters"),
        ({"json": {"text": "a", "beam": 99}}, 422, "beam: 99 is out of range"),
        (
            {"content": chunked(), "headers": {"Content-Type": "application/json"}},
            413,
            "more than this server's limits allow",
        ),
        ({"json": {"text": [1, 2]}}, 422, "text[0]"),
    ]
    return kinds[k % len(kinds)]


def huge_lines(lines: list[str]) -> list[str]:
    """The most lines a request may hold, each several sentences up to --max-chars (and past the model's length)."""
    return [((line + " ") * 8)[: OPTIONS.max_chars] for line in lines[:16]]


@pytest.fixture(scope="module")
def lines(multi30k) -> list[str]:
    return head(multi30k / "test_2016_flickr.en", 128)


@pytest.mark.slow
def test_hostile_mix_answers_every_good_request_exactly(translator, lines):
    # the checkpoint's decode settings, as the server's default
    expected = dict(zip(lines, translator.translate(lines)))
    huge = huge_lines(lines)
    expected_huge = translator.translate(huge)

    with serving(translator, OPTIONS) as (url, served):
        port = int(url.rsplit(":", 1)[1])
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(HALF_OPEN)]
        for s in stalled:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        try:
            outcome = asyncio.run(_mix(url, lines))
        finally:
            for s in stalled:
                s.close()
        assert served.batcher.alive

    good, bad, huge_answer, ready_codes = outcome
    for sent, status, body in good:
        assert status == 200 and body["translations"] == [expected[line] for line in sent], (sent, body)
    for (kind_status, words), status, body in bad:
        assert status == kind_status and words in body["error"] and "\n" not in body["error"], body
    assert huge_answer == (200, expected_huge)
    assert len(good) + len(bad) == CLIENTS * REQUESTS_EACH and len(bad) == CLIENTS * REQUESTS_EACH // 10 + 1
    assert ready_codes and set(ready_codes) == {200}


async def _mix(url: str, lines: list[str]):
    good: list = []
    bad: list = []
    ready_codes: list[int] = []
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client(c: int) -> None:
            for r in range(REQUESTS_EACH):
                n = c * REQUESTS_EACH + r
                if n % 10 == 0:  # one request in ten is bad
                    kwargs, status, words = bad_request(n // 10)
                    answer = await client.post("/translate", **kwargs)
                    bad.append(((status, words), answer.status_code, answer.json()))
                    continue
                sent = [lines[(n + i) % len(lines)] for i in range(1 + n % 3)]
                answer = await client.post("/translate", json={"text": sent})
                good.append((sent, answer.status_code, answer.json()))

        async def huge_client() -> tuple[int, list]:
            answer = await client.post("/translate", json={"text": huge_lines(lines)})
            return answer.status_code, answer.json().get("translations")

        async def ready_probe() -> None:
            for _ in range(10_000):  # bounded; stops when the mix is over
                ready_codes.append((await client.get("/ready")).status_code)
                if done.is_set():
                    return
                await asyncio.sleep(0.01)

        probe = asyncio.create_task(ready_probe())
        huge = asyncio.create_task(huge_client())
        await asyncio.gather(*(one_client(c) for c in range(CLIENTS)))
        huge_answer = await huge
        done.set()
        await probe
    return good, bad, huge_answer, ready_codes
