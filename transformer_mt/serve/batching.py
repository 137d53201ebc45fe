"""Cross-request batching: requests that arrive within a few milliseconds are decoded in one call.

One :class:`Batcher` per served model owns a bounded queue and one worker thread. The HTTP handlers
(asyncio) put :class:`Job` s in; the worker takes the first waiting job, waits up to ``wait_s`` for
more to join until the batch holds ``batch_tokens`` source tokens, decodes the jobs that share decode
settings (beam, lenpen, nbest) in one ``translate`` call, splits the results back by job, in order,
and resolves each job's future on its event loop. A full queue refuses at once (:class:`QueueFull`,
HTTP 503), so a caller never hangs on an overloaded server.

Pure Python and threads: no web framework here, so the batching is tested without a server.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# translate(lines, beam=, lenpen=, nbest=) -> one n-best list [(score, text), ...] per line, in order.
TranslateFn = Callable[..., list]


class QueueFull(Exception):
    """The model's queue holds ``max_queue`` waiting requests; the caller should retry later (503)."""


class Stopped(Exception):
    """The server is shutting down and takes no new requests (503)."""


@dataclass
class Job:
    """One request: its lines, their source tokens, its decode settings and where its answer goes."""

    lines: list[str]
    ntokens: int  # source pieces in the request (+1 EOS per line), what batches are sized by
    settings: tuple[int, float, int]  # (beam, lenpen, nbest): only equal settings share one search
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)

    def resolve(self, result: list | None = None, error: BaseException | None = None) -> None:
        """Hand the result (or error) to the waiting handler, from the worker thread."""

        def settle() -> None:
            if self.future.done():  # the client went away and the handler was cancelled
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(settle)


class Batcher:
    """A queue and a worker thread that decodes the queued requests of one model in batches."""

    def __init__(self, translate: TranslateFn, *, name: str, max_queue: int, batch_tokens: int, wait_s: float):
        self.translate, self.name = translate, name
        self.batch_tokens, self.wait_s = batch_tokens, wait_s
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._stopping = False
        # Counters for /health and /models (read without the lock: ints, written by one thread each).
        self.requests = 0  # jobs accepted
        self.rejected = 0  # jobs refused because the queue was full
        self.batches = 0  # translate calls made; < requests when batching happened
        self.lines = 0  # lines decoded
        self.busy = False  # a translate call is running now
        self._thread = threading.Thread(target=self._run, name=f"tmt-batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job`` or refuse it at once: Stopped while shutting down, QueueFull when full."""
        with self._lock:
            if self._stopping:
                raise Stopped(f"model {self.name!r} is shutting down")
            try:
                self._queue.put_nowait(job)
            except queue.Full:
                self.rejected += 1
                raise QueueFull(f"model {self.name!r} has {self._queue.maxsize} requests waiting; retry shortly") from None
            self.requests += 1

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, finish every queued one, then end the worker."""
        with self._lock:
            self._stopping = True
        self._queue.put(None)  # after every accepted job: the worker drains them first
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, stop = self._gather(first)
            # Requests with other decode settings cannot share a search: one call per settings group, in arrival order.
            for _, group in itertools.groupby(sorted(jobs, key=lambda j: j.settings), key=lambda j: j.settings):
                self._decode(list(group))
            if stop:
                return

    def _gather(self, first: Job) -> tuple[list[Job], bool]:
        """``first`` plus the jobs that arrive within ``wait_s`` of it, until ``batch_tokens`` source tokens."""
        jobs, tokens = [first], first.ntokens
        deadline = time.monotonic() + self.wait_s
        while tokens < self.batch_tokens:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            tokens += job.ntokens
        return jobs, False

    def _decode(self, jobs: list[Job]) -> None:
        beam, lenpen, nbest = jobs[0].settings
        lines = [line for job in jobs for line in job.lines]
        self.busy = True
        try:
            results = self.translate(lines, beam=beam, lenpen=lenpen, nbest=nbest)
        except Exception as exc:  # noqa: BLE001 - every waiting caller must hear about it, the worker must live on
            for job in jobs:
                job.resolve(error=exc)
            return
        finally:
            self.busy = False
            self.batches += 1
        self.lines += len(lines)
        start = 0
        for job in jobs:
            job.resolve(results[start : start + len(job.lines)])
            start += len(job.lines)
