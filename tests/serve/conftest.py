"""Fixtures of the server tests: a small random checkpoint and its Translator, and `tmt serve`'s app run
by uvicorn in this process on a loopback port (port 0: the kernel picks a free one)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import make_checkpoint

if TYPE_CHECKING:
    from transformer_mt.serve.models import ServedModel

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")


@pytest.fixture(scope="session")
def random_checkpoint(spm_model, tmp_path_factory) -> Path:
    """A random 1+1-layer model with the 1000-piece tokenizer (beam 3, outputs of at most 6 tokens + source)."""
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("serve_ckpt") / "m.pt")


@pytest.fixture(scope="session")
def translator(random_checkpoint):
    from transformer_mt.decoding import Translator

    return Translator.from_checkpoint(random_checkpoint, device="cpu", threads=1)


def loopback_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1 (the kernel picks it), for :func:`in_process`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def in_process(app, options, sock: socket.socket, *, timeout: float = 30.0) -> Iterator[str]:
    """Run ``app`` with :func:`transformer_mt.serve.server.build_server` on ``sock`` in a thread; yield its URL."""
    from transformer_mt.serve.server import build_server

    port = sock.getsockname()[1]
    server = build_server(app, options, host="127.0.0.1", port=port, log_level="critical")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


@contextmanager
def serving(translator, options, *, translate=None, name: str = "m") -> Iterator[tuple[str, ServedModel]]:
    """One model served in process; ``translate`` replaces its Runner's (an instrumented fake). Yields (url,
    ServedModel)."""
    from transformer_mt.serve import allowed_hosts
    from transformer_mt.serve.app import build_app, serve_model

    served = serve_model(name, translator, options, path="/secret/dir/m.pt", translate=translate)
    sock = loopback_socket()
    app = build_app([served], options, hosts=allowed_hosts("127.0.0.1", sock.getsockname()[1]))
    try:
        with in_process(app, options, sock) as url:
            yield url, served
    finally:
        served.batcher.stop(5)
