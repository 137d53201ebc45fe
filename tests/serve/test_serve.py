"""`tmt serve`: the real server process on a loopback port, spoken to over HTTP.

Expectations come from `tmt translate` (a separate process on the same checkpoint and settings), from
a list of bad requests with the answer each must get, and from counting: 32 concurrent clients must each get
exactly their own lines back and the server must have needed fewer decode batches than requests.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import REPO, head

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(*args: str, timeout: float = 120.0):
    """Start `tmt serve ARGS` on a free loopback port; yield (base_url, process) once /health answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transformer_mt.cli",
            "serve",
            "--port",
            str(port),
            "--threads",
            "1",
            "--log-level",
            "warning",
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not answer /health in time"
            time.sleep(0.2)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def tmt_translate(ckpt: Path, lines: list[str], tmp_path: Path, *args: str) -> list[str]:
    """`tmt translate` on these lines, as a user runs it: its output lines."""
    src = tmp_path / f"in_{len(lines)}_{'_'.join(args)}.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "transformer_mt.cli", "translate", "-c", str(ckpt), str(src), "--threads", "1", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split("\n")[:-1]


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tiny_checkpoint_postnorm):
    """Two models (pre-norm "pre", the default, and post-norm "post"), with small request limits."""
    with running_server(
        "-c",
        f"pre={tiny_checkpoint}",
        "-c",
        f"post={tiny_checkpoint_postnorm}",
        "--max-lines",
        "64",
        "--max-chars",
        "3000",
    ) as (url, _):
        yield url


@pytest.fixture(scope="module")
def test_lines(multi30k) -> list[str]:
    return head(multi30k / "test_2016_flickr.en", 96)


def test_translations_equal_tmt_translate(served, tiny_checkpoint, tiny_checkpoint_postnorm, test_lines, tmp_path):
    lines = test_lines[:40]
    lines[7] = ""  # an empty line gives an empty translation, as in tmt translate
    for ckpt, model, args, body in (
        (tiny_checkpoint, None, (), {}),  # the checkpoint's own decode settings
        (tiny_checkpoint, "pre", ("--beam", "4", "--lenpen", "1.0"), {"beam": 4, "lenpen": 1.0}),
        (tiny_checkpoint_postnorm, "post", ("--beam", "1"), {"beam": 1}),
    ):
        r = httpx.post(
            f"{served}/translate", json={"text": lines, **({"model": model} if model else {}), **body}, timeout=60
        )
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["model"] == (model or "pre") and answer["warnings"] == [] and answer["time_ms"] > 0
        assert answer["translations"] == tmt_translate(ckpt, lines, tmp_path, *args)
    assert len(set(answer["translations"])) > 20
    # One string in, a list of one translation out; n-best: tmt translate's INDEX<TAB>SCORE<TAB>TEXT lines.
    r = httpx.post(f"{served}/translate", json={"text": lines[0], "beam": 3, "nbest": 3}, timeout=60).json()
    expected = [
        line.split("\t") for line in tmt_translate(tiny_checkpoint, lines[:1], tmp_path, "--beam", "3", "--nbest", "3")
    ]
    assert [[h["text"], f"{h['score']:.4f}"] for h in r["translations"][0]] == [
        [text, score] for _, score, text in expected
    ]


def test_concurrent_clients_get_their_own_lines_in_order(served, tiny_checkpoint, test_lines, tmp_path):
    expected = tmt_translate(tiny_checkpoint, test_lines, tmp_path)  # 96 lines, the checkpoint's decode settings
    before = httpx.get(f"{served}/health").json()
    n, barrier = 32, threading.Barrier(32)
    answers: list = [None] * n

    def client(i: int) -> None:
        mine = test_lines[3 * i : 3 * i + 3]  # every client its own three lines
        with httpx.Client(timeout=120) as c:
            barrier.wait()
            answers[i] = c.post(f"{served}/translate", json={"text": mine}).json()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, answer in enumerate(answers):
        assert answer["translations"] == expected[3 * i : 3 * i + 3], i  # zero lost, zero swapped, in order
    after = httpx.get(f"{served}/health").json()
    assert after["requests"] - before["requests"] == n and after["lines"] - before["lines"] == 3 * n
    assert after["batches"] - before["batches"] < n  # requests were decoded together
    models = httpx.get(f"{served}/models").json()
    assert models["default"] == "pre" and [m["name"] for m in models["models"]] == ["pre", "post"]
    assert models["models"][0]["stats"]["batches"] < models["models"][0]["stats"]["requests"]


BAD = [  # (body or raw bytes, content type, status, words the error must contain)
    (b'{"text": "A man.', "application/json", 400, "malformed JSON"),
    (b'{"text": "a"}', "text/plain", 415, "Content-Type: application/json"),
    (b"[1, 2]", "application/json", 422, "body: not a JSON object"),
    ({}, None, 422, "text: Field required"),
    ({"text": 5}, None, 422, "text: Input should be a valid string"),
    ({"text": ["a", 5]}, None, 422, "text[1]"),
    ({"text": "a", "beam": "5"}, None, 422, "beam: Input should be a valid integer"),
    ({"text": "a", "nbest": True}, None, 422, "nbest"),
    ({"text": "a", "beem": 5}, None, 422, "beem: unknown field"),
    ({"text": []}, None, 422, "text: an empty list"),
    ({"text": ["a", "b\nc"]}, None, 422, "text[1]: contains a line break"),
    ({"text": ["a"] * 65}, None, 413, "65 lines, more than --max-lines 64"),
    ({"text": ["a", "b" * 3001]}, None, 413, "text[1]: 3001 characters, more than --max-chars 3000"),
    ({"text": "a", "model": "big"}, None, 404, "'big' is not served; choose one of 'pre', 'post'"),
    ({"text": "a", "beam": 17}, None, 422, "beam: 17 is out of range; use 1 (greedy) to 16"),
    ({"text": "a", "beam": 0}, None, 422, "beam: 0 is out of range"),
    ({"text": "a", "beam": 2, "nbest": 3}, None, 422, "nbest: 3 is out of range; use 1 to the beam size (2)"),
    ({"text": "a", "lenpen": 1e308}, None, 422, "lenpen: 1e+308 is out of range; use -10 to 10"),
    (b'{"text": "\\ud800"}', "application/json", 422, "is not valid Unicode (a lone surrogate \\ud800 at character 0)"),
]


@pytest.mark.parametrize("body, content_type, status, words", BAD, ids=[str(b[3]) for b in BAD])
def test_bad_request_gets_its_4xx_and_the_server_answers_after(served, body, content_type, status, words):
    if isinstance(body, bytes):
        r = httpx.post(f"{served}/translate", content=body, headers={"Content-Type": content_type})
    else:
        r = httpx.post(f"{served}/translate", json=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert "\n" not in r.json()["error"]
    ok = httpx.post(f"{served}/translate", json={"text": "A dog runs.", "beam": 1}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["translations"]) == 1


def test_unknown_path_huge_body_overlong_line_and_openapi(served):
    r = httpx.get(f"{served}/translations")
    assert r.status_code == 404 and "POST /translate" in r.json()["error"]
    assert "/translate" in httpx.get(f"{served}/openapi.json").json()["paths"]
    # 64 lines x 3000 characters at most, 12 bytes each in the longest JSON escape: a bigger body is refused
    # as it arrives, before parsing.
    r = httpx.post(f"{served}/translate", json={"text": ["a" * 2999] * 800})
    assert r.status_code == 413 and "more than this server's limits allow" in r.json()["error"]
    r = httpx.post(
        f"{served}/translate", json={"text": ["a" * 2999] * 400}
    )  # under the byte cap: the line limit speaks
    assert r.status_code == 413 and "400 lines, more than --max-lines 64" in r.json()["error"]
    # Over the model's 1023 pieces (max_positions 1024, EOS included) but under --max-chars: truncated, with a warning.
    r = httpx.post(f"{served}/translate", json={"text": ["A man.", "a " * 1100], "beam": 1}, timeout=60).json()
    assert len(r["translations"]) == 2 and len(r["warnings"]) == 1
    assert (
        r["warnings"][0].startswith("text[1]: ") and "truncated to 1023 (model.max_positions=1024)" in r["warnings"][0]
    )


def _slow_request(url: str, lines: list[str], box: dict) -> threading.Thread:
    """A request that keeps the worker busy for a second or two (128 lines, beam 16), answered into ``box``."""

    def run() -> None:
        box["response"] = httpx.post(f"{url}/translate", json={"text": lines, "beam": 16}, timeout=120)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not httpx.get(f"{url}/health").json()["busy"]:  # the worker has taken it and is decoding
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    return thread


def test_full_queue_answers_503_never_hangs(tiny_checkpoint, test_lines):
    with running_server("-c", str(tiny_checkpoint), "--max-queue", "1", "--batch-wait-ms", "0") as (url, _):
        box: dict = {}
        slow = _slow_request(url, (test_lines * 2)[:128], box)
        answers: list = [None] * 6

        def client(i: int) -> None:
            answers[i] = httpx.post(f"{url}/translate", json={"text": f"A dog number {i}.", "beam": 1}, timeout=120)

        clients = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in clients:
            t.start()
        for t in clients + [slow]:
            t.join()
        codes = [a.status_code for a in answers]
        # While the worker decodes the slow request, one small request waits in the one queue slot (and is
        # answered later); the others are refused at once.
        assert box["response"].status_code == 200 and 200 in codes and 503 in codes and set(codes) <= {200, 503}
        refused = next(a for a in answers if a.status_code == 503)
        assert "requests waiting; retry shortly" in refused.json()["error"] and refused.headers["Retry-After"] == "1"
        assert httpx.get(f"{url}/health").json()["rejected"] == codes.count(503)
        assert httpx.post(f"{url}/translate", json={"text": "A dog."}, timeout=60).status_code == 200


def test_sigterm_finishes_the_request_in_flight(tiny_checkpoint, test_lines, tmp_path):
    lines = (test_lines * 2)[:128]
    with running_server("-c", str(tiny_checkpoint)) as (url, proc):
        box: dict = {}
        slow = _slow_request(url, lines, box)
        proc.send_signal(signal.SIGTERM)
        slow.join()
        # uvicorn >= 0.29 re-raises the signal once its graceful shutdown is done: -SIGTERM is the clean exit.
        assert proc.wait(60) in (0, -signal.SIGTERM)
    assert box["response"].status_code == 200
    assert box["response"].json()["translations"] == tmt_translate(tiny_checkpoint, lines, tmp_path, "--beam", "16")
    with pytest.raises(httpx.TransportError):  # and it is gone
        httpx.get(f"{url}/health", timeout=2)


def test_missing_extra_names_the_install_command(tiny_checkpoint, capsys, monkeypatch):
    from transformer_mt.cli import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # what `import fastapi` meets without the extra
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "-c", str(tiny_checkpoint)])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == 'tmt: error: fastapi, uvicorn or prometheus-client is not installed; run: pip install -e ".[serve]"'
    )


def test_port_in_use_is_one_line_before_loading(capsys):
    from transformer_mt.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "-c", "no-such.pt", "--port", str(port)])  # refused before the checkpoint is even looked at
    err = capsys.readouterr().err.strip()
    assert (
        exit_.value.code == 2
        and err.startswith(f"tmt: error: --host 127.0.0.1 --port {port}: cannot listen there (")
        and "\n" not in err
    )


def test_duplicate_model_names_are_refused_before_loading():
    from transformer_mt.serve import ServeError, ServeOptions
    from transformer_mt.serve.app import load_models

    with pytest.raises(ServeError, match="'a' is already served; name them apart with -c NAME=PATH"):
        load_models(["a=missing1.pt", "x/a.pt"], device="cpu", threads=0, options=ServeOptions())
