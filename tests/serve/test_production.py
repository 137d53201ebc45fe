"""`tmt serve`'s app in this process (uvicorn on a loopback port) against what an exposed server meets:
bodies over the cap (chunked too), escaped text within the limits, deadlines, clients that leave, a dead
worker, a full queue, metrics, API keys, paths in answers, stalled request heads and the output cap.

Where the decode must be held or fail on cue, the model's translate function is an instrumented fake;
assertions are about answers, counts and order, never about time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest

from tests.serve.conftest import serving
from transformer_mt.serve import ServeOptions

httpx = pytest.importorskip("httpx")


class Held:
    """A fake translate ("LINE" -> "LINE!") that blocks on a line containing "HOLD" until released."""

    def __init__(self):
        self.release = threading.Event()
        self.holding = threading.Event()
        self.seen: list[str] = []

    def __call__(self, lines, **_settings):
        self.seen.extend(lines)
        if any("HOLD" in line for line in lines):
            self.holding.set()
            assert self.release.wait(30), "the test never released the worker"
        return [[(0.0, f"{line}!")] for line in lines]


def test_a_chunked_body_over_the_cap_is_refused_as_it_arrives(translator):
    options = ServeOptions(max_lines=4, max_chars=100, batch_wait_ms=0)
    cap = options.max_body_bytes
    sent = {"bytes": 0}

    def chunks():  # no Content-Length: only counting the arriving bytes can stop it
        yield b'{"text": ["'
        for _ in range(2 * cap // 1000):
            sent["bytes"] += 1000
            yield b"a" * 1000
        yield b'"]}'

    with serving(translator, options) as (url, served):
        r = httpx.post(f"{url}/translate", content=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and f"more than {cap} bytes" in r.json()["error"], r.text
        assert served.batcher.requests == 0  # never parsed, never queued
        assert httpx.post(f"{url}/translate", json={"text": "A dog."}, timeout=30).status_code == 200


def test_escaped_non_ascii_within_the_limits_is_translated(translator):
    """Python's json.dumps writes every emoji as a 12-byte surrogate-pair escape: 3 lines of 1000 emoji are
    36,000 bytes of JSON for 3000 characters, within --max-lines 4 and --max-chars 1000, though more than a
    cap of 4 UTF-8 bytes per character would allow."""
    options = ServeOptions(max_lines=4, max_chars=1000, batch_wait_ms=0)
    lines = ["\U0001f600" * 1000, "\u00e9t\u00e9 " * 250, "\U0001f40b" * 1000, "A dog."]
    body = json.dumps({"text": lines})  # ensure_ascii: "\ud83d\ude00" per emoji
    assert body.isascii() and len(body) > options.max_lines * (4 * options.max_chars + 8) + 4096
    with serving(translator, options) as (url, _):
        r = httpx.post(f"{url}/translate", content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == translator.translate(lines)
        over = json.dumps({"text": ["\U0001f600" * 1001]})  # one character too many: the decoded text decides
        r = httpx.post(f"{url}/translate", content=over, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "text[0]: 1001 characters, more than --max-chars 1000" in r.json()["error"]


def test_timeout_answers_504_and_the_others_are_still_answered(translator):
    fake = Held()
    options = ServeOptions(timeout=0.5, batch_wait_ms=0, batch_tokens=4)
    with serving(translator, options, translate=fake) as (url, served):
        box: dict = {}
        slow = threading.Thread(
            target=lambda: box.update(
                r=httpx.post(f"{url}/translate", json={"text": ["HOLD", "rest one", "rest two"]}, timeout=30)
            )
        )
        slow.start()
        assert fake.holding.wait(30)
        slow.join(30)  # its deadline passes while its first chunk is held
        assert box["r"].status_code == 504 and "no answer within --timeout 0.5 s" in box["r"].json()["error"]
        other: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: other.update(r=httpx.post(f"{url}/translate", json={"text": "next"}, timeout=30))
        )
        waiter.start()
        fake.release.set()
        waiter.join(30)
        assert other["r"].status_code == 200 and other["r"].json()["translations"] == ["next!"]
    # the rest of the timed-out request was never decoded
    assert "rest one" not in fake.seen and served.batcher.dropped == 1


def test_a_client_that_disconnects_has_its_job_dropped(translator):
    fake = Held()
    options = ServeOptions(batch_wait_ms=0)
    with serving(translator, options, translate=fake) as (url, served):
        holder = threading.Thread(target=lambda: httpx.post(f"{url}/translate", json={"text": "HOLD"}, timeout=30))
        holder.start()
        assert fake.holding.wait(30)

        async def leave() -> None:  # queue a request behind the held one, then hang up
            async with httpx.AsyncClient() as client:
                task = asyncio.create_task(client.post(f"{url}/translate", json={"text": "abandoned"}, timeout=30))
                while served.batcher.waiting < 1:
                    await asyncio.sleep(0.01)
                task.cancel()  # closes its connection
                with pytest.raises(asyncio.CancelledError):
                    await task

        asyncio.run(leave())
        for _ in range(1000):  # until the server notices the closed connection and marks the queued job
            if any(job.gone == "disconnected" for job in list(served.batcher._inbox)):
                break
            threading.Event().wait(0.01)
        else:
            raise AssertionError("the queued job of the client that left was never marked")
        fake.release.set()
        holder.join(30)
        assert httpx.post(f"{url}/translate", json={"text": "after"}, timeout=30).json()["translations"] == ["after!"]
    assert "abandoned" not in fake.seen and served.batcher.dropped == 1


def test_ready_is_503_when_the_queue_is_full_or_the_worker_is_dead(translator):
    fake = Held()
    options = ServeOptions(max_queue=1, batch_wait_ms=0)
    with serving(translator, options, translate=fake) as (url, served):
        assert httpx.get(f"{url}/ready").json() == {"status": "ready", "models": ["m"]}
        threads = [
            threading.Thread(target=lambda t=t: httpx.post(f"{url}/translate", json={"text": t}, timeout=30))
            for t in ("HOLD", "queued")
        ]
        threads[0].start()
        assert fake.holding.wait(30)
        threads[1].start()
        for _ in range(1000):
            if served.batcher.waiting == 1:
                break
            threading.Event().wait(0.01)
        r = httpx.get(f"{url}/ready")
        assert r.status_code == 503 and "1 requests waiting, the --max-queue bound" in r.json()["error"]
        assert httpx.get(f"{url}/health").status_code == 200  # alive all the same
        fake.release.set()
        for t in threads:
            t.join(30)
        assert httpx.get(f"{url}/ready").status_code == 200
        served.batcher.stop(10)  # the worker ends: as if it had died
        r = httpx.get(f"{url}/ready")
        assert r.status_code == 503 and "model 'm': its worker thread is not running" in r.json()["error"]


def test_metrics_parse_and_count_what_was_sent(translator):
    from prometheus_client.parser import text_string_to_metric_families

    options = ServeOptions(batch_wait_ms=0)
    lines = ["A man.", "", "Two dogs play."]
    with serving(translator, options) as (url, _):
        for _ in range(3):
            assert httpx.post(f"{url}/translate", json={"text": lines}, timeout=30).status_code == 200
        assert httpx.post(f"{url}/translate", json={"text": "a", "beam": 99}).status_code == 422
        assert httpx.get(f"{url}/nowhere").status_code == 404
        text = httpx.get(f"{url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("tmt_http_requests_total", (("path", "/translate"), ("status", "200")))] == 3
    assert samples[("tmt_http_requests_total", (("path", "/translate"), ("status", "422")))] == 1
    assert samples[("tmt_http_requests_total", (("path", "other"), ("status", "404")))] == 1
    assert samples[("tmt_http_request_seconds_count", (("path", "/translate"),))] == 4
    assert samples[("tmt_lines_total", (("model", "m"),))] == 9
    pieces = sum(len(p) + 1 for p in translator.src_tok.encode(lines) if p)  # + EOS per non-blank line
    assert samples[("tmt_source_tokens_total", (("model", "m"),))] == 3 * pieces
    assert samples[("tmt_queue_wait_seconds_count", (("model", "m"),))] == 3
    assert samples[("tmt_batch_lines_sum", (("model", "m"),))] == 9
    assert samples[("tmt_target_tokens_total", (("model", "m"),))] >= 3 * 2  # at least EOS per non-blank line
    assert (
        samples[("tmt_queue_depth", (("model", "m"),))] == 0 and samples[("tmt_worker_alive", (("model", "m"),))] == 1
    )


def test_api_keys_and_no_paths_in_answers(translator, tmp_path):
    from transformer_mt.serve import ServeError, load_api_keys

    key_file = tmp_path / "keys"
    key_file.write_text("# operators\na-first-key-0123456789\n\n  second-key-abcdefghijkl\n")
    options = ServeOptions(api_keys=load_api_keys(key_file), batch_wait_ms=0)
    with serving(translator, options) as (url, _):
        for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"X-API-Key": "a-first-key-012345678"}):
            r = httpx.post(f"{url}/translate", json={"text": "A man."}, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"] and r.headers["WWW-Authenticate"] == "Bearer"
        assert httpx.get(f"{url}/models").status_code == 401 and httpx.get(f"{url}/metrics").status_code == 401
        # probes stay open
        assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/ready").status_code == 200
        ok = httpx.post(
            f"{url}/translate", json={"text": "A man."}, headers={"Authorization": "Bearer second-key-abcdefghijkl"}
        )
        assert ok.status_code == 200 and ok.json()["translations"] == [translator.translate("A man.")]
        models = httpx.get(f"{url}/models", headers={"X-API-Key": "a-first-key-0123456789"})
        assert (
            models.status_code == 200
            and "/" not in json.dumps(models.json())
            and models.json()["models"][0]["name"] == "m"
        )
    key_file.write_text("short\n")
    with pytest.raises(ServeError, match="line 1: a key must be at least 16 printable ASCII characters"):
        load_api_keys(key_file)


def test_a_stalled_request_head_is_closed(translator):
    options = ServeOptions(header_timeout=0.3, batch_wait_ms=0)
    with serving(translator, options) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
            stalled.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Le")
            answer = b""
            while chunk := stalled.recv(4096):  # the server answers 408 and closes; recv's own timeout bounds the wait
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ") and b"--header-timeout" in answer
        assert httpx.get(f"{url}/health").status_code == 200


def test_the_output_cap_limits_long_outputs_only(translator):
    """decode.max_len_b is 6 for this checkpoint: --max-output-tokens 3 caps a line whose limit (source + 6)
    is longer; the Translator's own max_len_a 0 / max_len_b 3 call gives the same hypotheses."""
    options = ServeOptions(max_output_tokens=3, batch_wait_ms=0)
    line = "Two young men are playing football on a field."
    with serving(translator, options) as (url, _):
        r = httpx.post(f"{url}/translate", json={"text": [line, ""], "beam": 1}, timeout=30)
    capped = translator.translate_batch(
        [line], beam=1, lenpen=translator.cfg.decode.lenpen, max_len_a=0.0, max_len_b=3
    ).hypotheses[0][0][1]
    assert r.json()["translations"] == [capped, ""]
    assert len(translator.tgt_tok.encode([capped])[0]) <= 3


def test_options_out_of_range_and_the_exposed_host_warning(capsys):
    from transformer_mt.serve import ServeError, serve

    cases: list[tuple[dict[str, Any], str]] = [
        ({"timeout": -1.0}, "--timeout -1.0: must be >= 0"),
        ({"header_timeout": 0.0}, "--header-timeout 0.0: must be > 0"),
    ]
    for changes, words in cases:
        with pytest.raises(ServeError, match=words):
            ServeOptions(**changes).check()
    assert "secret" not in repr(ServeOptions(api_keys=("secret-key-0123456789",)))
    with pytest.raises(Exception, match="no-such.pt"):  # the warning comes before the models load (and fail here)
        serve(["no-such.pt"], host="0.0.0.0", port=0, device="cpu")
    assert (
        "tmt: warning: --host 0.0.0.0 accepts connections from other machines and no --api-key-file is set"
        in capsys.readouterr().err
    )
    with pytest.raises(Exception, match="no-such.pt"):
        serve(["no-such.pt"], host="127.0.0.1", port=0, device="cpu")
    assert "warning" not in capsys.readouterr().err
