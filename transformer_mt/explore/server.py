"""Starting `tmt explore`: check the options and the address, load the checkpoints, serve the page until Ctrl-C."""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer_mt.explore.errors import INSTALL_HINT, ExploreError
from transformer_mt.explore.session import Explorer, Limits, load_explorer
from transformer_mt.serve import HostGuard, ServeOptions, address_problem, allowed_hosts

# serve's connection limits for one user's page: the header timeout, keep-alive and graceful stop as serve has
# them, and far fewer connections at once than a service needs
EXPLORE_LIMITS = ServeOptions(max_connections=64, shutdown_timeout=5)


def require_fastapi() -> None:
    """Raise ExploreError naming the install command when fastapi or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ExploreError(INSTALL_HINT) from None


def build(
    checkpoints: list[str],
    *,
    examples: str | Path | None = None,
    device: str = "cpu",
    threads: int = 0,
    limits: Limits | None = None,
    allowed: frozenset[str] | None = None,
    on_startup: Callable[[], None] | None = None,
):
    """The app over freshly loaded checkpoints (tests and notebooks serve it themselves), and its Explorer: the
    FastAPI app behind the Host check (``allowed``, from serve's ``allowed_hosts``; None: any Host) and the body cap."""
    require_fastapi()
    from transformer_mt.explore.app import build_app
    from transformer_mt.explore.guard import BodyCap, body_cap

    explorer: Explorer = load_explorer(checkpoints, examples=examples, device=device, threads=threads, limits=limits)
    app = build_app(explorer)
    if on_startup is not None:
        app.router.on_startup.append(on_startup)
    return HostGuard(BodyCap(app, max_bytes=body_cap(explorer.limits.max_chars)), allowed=allowed), explorer


def explore(
    checkpoints: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    examples: str | Path | None = None,
    device: str = "cpu",
    threads: int = 0,
    limits: Limits | None = None,
    allowed_extra: Sequence[str] = (),
    log_level: str = "warning",
    on_ready=None,
) -> None:
    """Load the checkpoints (``PATH`` or ``NAME=PATH``), then serve the page on host:port until Ctrl-C, answering
    only the Host names it is reached by (plus ``allowed_extra``), with serve's header timeout and connection cap.
    ``on_ready(url)`` is called once the server listens."""
    require_fastapi()
    import torch

    from transformer_mt import runtime
    from transformer_mt.serve.server import build_server

    problem = address_problem(host, port)  # before the (slow) loading
    if problem:
        raise ExploreError(problem)
    allowed = allowed_hosts(host, port, allowed_extra)  # a bad --allowed-host is one line before the loading too
    if not _is_loopback(host):
        print(
            f"tmt: warning: --host {host} accepts connections from other machines: anyone who reaches it can run "
            "the models and read the examples; tmt explore is meant for this machine (reach it from another through "
            "an SSH tunnel)",
            file=sys.stderr,
        )
    # torch's CPU threads are set per calling thread (OpenMP): requests run on server threads with `threads`, and
    # this thread, which only loads the checkpoints and runs the event loop, keeps one. Two teams of `threads` would
    # outnumber the cores, and OpenMP then stops spinning between parallel regions: every small matmul would wait
    # for its threads to wake up.
    workers = threads or torch.get_num_threads()
    runtime.set_threads(1)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
    ready = (lambda: on_ready(url)) if on_ready is not None else None
    app, _ = build(
        checkpoints, examples=examples, device=device, threads=workers, limits=limits, allowed=allowed, on_startup=ready
    )
    build_server(app, EXPLORE_LIMITS, host=host, port=port, log_level=log_level).run()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


class Background:
    """An app served by uvicorn in a thread of this process (tests, notebooks, the screenshot script): ``url``,
    ``stop()``."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0):
        import threading
        import time

        import uvicorn

        sock = socket.socket()
        sock.bind((host, port))  # port 0: the system picks a free one, bound here so nothing can take it first
        self.url = f"http://{host}:{sock.getsockname()[1]}/"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ExploreError(f"the explorer did not start on {self.url} within {timeout:g} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
