"""Starting `tmt serve`: check the options and the address, load the models, serve until SIGTERM / Ctrl-C."""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from transformer_mt.serve.errors import ServeError, require_serving
from transformer_mt.serve.hosts import allowed_hosts
from transformer_mt.serve.options import ServeOptions

if TYPE_CHECKING:
    from transformer_mt.decoding import TextTranslator


def serve(
    checkpoints: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
    threads: int = 0,
    options: ServeOptions | None = None,
    log_level: str = "info",
    load: Callable[[str], TextTranslator] | None = None,
) -> None:
    """Load every checkpoint (``PATH`` or ``NAME=PATH``), then serve until SIGTERM / Ctrl-C. ``load`` builds the
    translator of a checkpoint path (None: tmt's ``Translator``; `tmt serve --engine ctranslate2` gives its
    engine)."""
    options = options or ServeOptions()
    options.check()
    hosts = allowed_hosts(host, port, options.allowed_hosts)
    require_serving()
    from uvicorn.config import LOG_LEVELS

    if log_level not in LOG_LEVELS:
        raise ServeError(f"--log-level {log_level}: choose one of {', '.join(LOG_LEVELS)}")

    import torch

    from transformer_mt import runtime
    from transformer_mt.serve.app import build_app, load_models
    from transformer_mt.serve.server import build_server

    problem = address_problem(host, port)  # before the (slow) model loading
    if problem:
        raise ServeError(problem)
    if not options.api_keys and not _is_loopback(host):
        print(
            f"tmt: warning: --host {host} accepts connections from other machines and no --api-key-file is set: "
            "anyone who reaches it can translate",
            file=sys.stderr,
        )
    # torch's CPU threads are set per calling thread (OpenMP): the worker threads decode with `threads`, and this
    # thread, which only loads the models and runs the event loop, keeps one. Two teams of `threads` would
    # outnumber the cores, and OpenMP then stops spinning between parallel regions: every small matmul of a
    # decoding step would wait for its threads to wake up (a single request about twice as slow as the same call
    # made directly).
    workers = threads or torch.get_num_threads()
    runtime.set_threads(1)
    models = load_models(checkpoints, device=device, threads=workers, options=options, load=load)
    # uvicorn's own SIGTERM/SIGINT handling: stop listening, let in-flight requests finish (at most
    # --shutdown-timeout seconds), then run the app's shutdown (which drains the batch queues).
    build_server(build_app(models, options, hosts=hosts), options, host=host, port=port, log_level=log_level).run()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: loopback only if every address it has is
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def address_problem(host: str, port: int) -> str | None:
    """None when this process can listen on host:port, else one line saying why not (in use, not local, not a
    port): checked before the (slow) model loading, as uvicorn would find it after. `tmt explore` asks it too."""
    if not 0 <= port <= 65535:  # the socket calls would raise OverflowError, not OSError
        return f"--port {port}: must be 0 to 65535 (a TCP port); choose a free one, e.g. 8000"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            # as uvicorn binds: a port in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(addr)
    except OSError as exc:
        return (
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
            "choose another --port or stop the program using it"
        )
    return None
