"""Cross-request batching with fair chunks: many small requests share one decode call, and a large
request is decoded a chunk at a time between them.

One :class:`Batcher` per served model owns an inbox (bounded by ``max_queue`` waiting requests) and one
worker thread. The HTTP handlers (asyncio) submit :class:`Job` s; the worker

1. takes every job that has arrived and measures it (tokenization runs here, off the event loop);
2. builds the next batch of at most ``batch_tokens`` source tokens from the jobs that share the decode
   settings (beam, lenpen, nbest) of the job served least so far: each contributes its next chunk of
   lines, the least-served first, so a one-line request that arrives while a large one is being decoded
   rides in the very next batch instead of waiting for the large one to finish;
3. decodes the batch in one ``translate`` call; if that call raises, it decodes each job's chunk alone,
   so only the request at fault gets the error and the others their translations;
4. hands each finished job its n-best lists on its event loop.

A job whose client has gone or whose deadline has passed is dropped: from the inbox, and from the
running work at the next chunk boundary (the chunk being decoded cannot be interrupted). A full inbox
refuses at once (:class:`QueueFull`, HTTP 503), so a caller never hangs on an overloaded server.

Pure Python and threads: no web framework here, so the batching is tested without a server.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# translate(lines, beam=, lenpen=, nbest=) -> one n-best list [(score, text), ...] per line, in order.
TranslateFn = Callable[..., list]
# prepare(lines) -> (source tokens per line, warnings): what a batch is sized by, and what to tell the client.
PrepareFn = Callable[[list[str]], tuple[list[int], list[str]]]

# A job left out of this many batches in a row (others kept filling the budget) goes first in the next:
# a large request advances even while small ones keep arriving.
STARVING_AFTER = 2


class QueueFull(Exception):
    """The model's inbox holds ``max_queue`` waiting requests; the caller should retry later (503)."""


class Stopped(Exception):
    """The server is shutting down and takes no new requests (503)."""


def count_words(lines: list[str]) -> tuple[list[int], list[str]]:
    """A stand-in :data:`PrepareFn` for callers without a tokenizer: words + EOS per non-blank line."""
    return [len(line.split()) + 1 if line.strip() else 0 for line in lines], []


class Arrivals:
    """Requests the server has begun to read but not yet submitted (their body is arriving or being parsed).

    Changed on the event loop only, read by the workers: while it is above zero, an idle worker waits (up to
    ``wait_s``) for those requests to join the batch it is about to start."""

    def __init__(self) -> None:
        self.count = 0


class BatchEvents:
    """What the worker reports as it goes (the server's metrics implement it); every method is a no-op here."""

    def started(self, waited_s: float) -> None:
        """A job's first chunk is being decoded, ``waited_s`` after it was submitted."""

    def batch(self, *, requests: int, lines: int, tokens: int, seconds: float) -> None:
        """One translate call ended: the requests and lines it held, their source tokens, its duration."""

    def dropped(self, reason: str) -> None:
        """A job was abandoned before its end: ``"timeout"`` or ``"disconnected"``."""

    def generated(self, tokens: int) -> None:
        """The translate function produced ``tokens`` target tokens (best hypotheses, + EOS each)."""


@dataclass(eq=False)
class Job:
    """One request: its lines and decode settings, where its answer goes, and the worker's progress on it."""

    lines: list[str]
    # (beam, lenpen, nbest), and an NLLB model's (source prefix, decoder prefix): only equal settings share a search
    settings: tuple
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the answer
    queued_at: float = field(default_factory=time.monotonic)
    # Written by the worker thread only.
    tokens: list[int] = field(default_factory=list)  # source tokens per line (0 for a blank line)
    warnings: list[str] = field(default_factory=list)  # per-line notes for the answer (truncation)
    results: list = field(default_factory=list)  # n-best lists of lines[:done]
    done: int = 0  # lines decoded so far; the next chunk starts here
    turns: int = 0  # batches this job was part of
    skipped: int = 0  # batches in a row this job was left out of
    # Written by the event loop: why the worker should stop on it (a str assignment is atomic).
    gone: str | None = None

    def drop(self, reason: str) -> None:
        """Tell the worker nobody waits for this job any more (client gone, deadline passed)."""
        self.gone = reason

    def abandoned(self, now: float) -> str | None:
        return self.gone or ("timeout" if now > self.deadline else None)

    def resolve(self, result: list | None = None, error: BaseException | None = None) -> None:
        """Hand the result (or error) to the waiting handler, from the worker thread."""

        def settle() -> None:
            if self.future.done():  # the handler stopped waiting (timeout, client gone)
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.loop.call_soon_threadsafe(settle)


Part = tuple[Job, int, int]  # a job's lines[start:end] inside one batch


class Batcher:
    """An inbox and a worker thread that decodes the requests of one model in fair, token-bounded batches."""

    def __init__(
        self,
        translate: TranslateFn,
        *,
        name: str,
        max_queue: int,
        batch_tokens: int,
        wait_s: float,
        prepare: PrepareFn = count_words,
        events: BatchEvents | None = None,
        arrivals: Arrivals | None = None,
        on_start: Callable[[], None] | None = None,
    ):
        self.translate, self.prepare, self.name, self.on_start = translate, prepare, name, on_start
        self.max_queue, self.batch_tokens, self.wait_s = max_queue, batch_tokens, wait_s
        self.events = events or BatchEvents()
        self.arrivals = arrivals or Arrivals()
        self._cond = threading.Condition()
        self._inbox: deque[Job] = deque()
        self._active: list[Job] = []  # taken by the worker, not finished (worker thread only)
        self._pending = 0  # jobs accepted and not finished: inbox + active
        self._in_batch = 0  # jobs in the translate call running now
        # The sizes of the last two batches and when the last ended: hints that a wave of requests is coming.
        self._last_batch_jobs = self._previous_batch_jobs = 0
        self._last_batch_end = 0.0
        self._stopping = False
        self._abandon = False
        # Counters for /health and /models (ints, each written under the lock or by the worker alone).
        self.requests = 0  # jobs accepted
        self.rejected = 0  # jobs refused because the inbox was full
        self.batches = 0  # translate calls made; < requests when batching happened
        self.lines = 0  # lines decoded
        self.dropped = 0  # jobs abandoned before their end (timeout, client gone)
        self.busy = False  # a translate call is running now
        self._thread = threading.Thread(target=self._run, name=f"tmt-batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests accepted and not yet finished, less those in the batch being decoded now."""
        return self._pending - self._in_batch

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def ready(self) -> bool:
        """The worker runs and the inbox can take another request."""
        return self.alive and not self._stopping and self.waiting < self.max_queue

    def submit(self, job: Job) -> None:
        """Queue ``job`` or refuse it at once: Stopped while shutting down, QueueFull when full."""
        with self._cond:
            if self._stopping or not self.alive:
                raise Stopped(f"model {self.name!r} is shutting down")
            if self.waiting >= self.max_queue:
                self.rejected += 1
                raise QueueFull(f"model {self.name!r} has {self.max_queue} requests waiting; retry shortly")
            self._inbox.append(job)
            self._pending += 1
            self.requests += 1
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs and finish the accepted ones; after ``timeout`` seconds, fail what is left with Stopped."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self._abandon = True  # the worker fails the rest after its current call
            self._thread.join(1.0)

    # ------------------------------------------------------------------ the worker thread
    def _run(self) -> None:
        if self.on_start is not None:  # per-thread set-up of the decoding (torch's CPU threads)
            self.on_start()
        while self._take_arrivals():
            if self._abandon:
                for job in self._active:
                    job.resolve(error=Stopped(f"model {self.name!r} stopped before this request was decoded"))
                return
            parts = self._next_batch()
            if parts:
                self._decode(parts)

    def _take_arrivals(self) -> bool:
        """Move the inbox into the active jobs (measuring each) and drop the abandoned; False once stopped and empty."""
        with self._cond:
            while not self._inbox and not self._active:
                if self._stopping:
                    return False
                self._cond.wait()
            if not self._active:
                self._await_wave()
            arrived = list(self._inbox)
            self._inbox.clear()
        for job in arrived:
            try:
                job.tokens, job.warnings = self.prepare(job.lines)
            except Exception as exc:  # noqa: BLE001 - the request at fault hears about it, the worker lives on
                self._finish(job, error=exc)
                continue
            self._active.append(job)
        now = time.monotonic()
        for job in list(self._active):
            reason = job.abandoned(now)
            if reason:
                self.dropped += 1
                self.events.dropped(reason)
                self._finish(job)  # its handler has answered already (504) or nobody listens
        return True

    def _await_wave(self) -> None:
        """Before an idle worker starts a batch, let the rest of a wave of concurrent requests join it, for up
        to ``wait_s`` after the later of the first waiting request and the end of the last batch: while
        requests are still being read, or until as many have come as the last two batches held (clients
        whose answers just went out come back at once; two half-waves that alternate merge into one).
        A lone client (nothing arriving, a last batch of one) never waits. Called holding the lock."""
        target = self._last_batch_jobs + (self._previous_batch_jobs if self._last_batch_jobs > 1 else 0)
        until = max(self._inbox[0].queued_at, self._last_batch_end) + self.wait_s
        while not self._stopping and (left := until - time.monotonic()) > 0:
            if self.arrivals.count <= 0 and len(self._inbox) >= max(target, 1):
                return
            self._cond.wait(min(left, 0.001) if self.arrivals.count > 0 else left)  # arrivals change without a notify

    def _next_batch(self) -> list[Part]:
        """The next chunks to decode together: the least-served job's settings group, least-served first."""
        if not self._active:
            return []

        def priority(job: Job) -> tuple[int, int, float]:
            return (0 if job.skipped >= STARVING_AFTER else 1, job.turns, job.queued_at)

        group = sorted(
            (j for j in self._active if j.settings == min(self._active, key=priority).settings), key=priority
        )
        budget = self.batch_tokens
        share = budget if len(group) == 1 else max(1, budget // 2)  # room left for the others when several wait
        parts: list[Part] = []
        for job in group:
            end, used = job.done, 0
            # The first part takes at least one line (a line over the budget is decoded alone); later ones fit or wait.
            while end < len(job.lines) and (
                used + job.tokens[end] <= min(budget, share) or not parts and end == job.done
            ):
                used += job.tokens[end]
                end += 1
            if end > job.done:
                parts.append((job, job.done, end))
                budget -= used
                job.turns, job.skipped = job.turns + 1, 0
            else:
                job.skipped += 1
        return parts

    def _decode(self, parts: list[Part]) -> None:
        beam, lenpen, nbest, *codes = parts[0][0].settings
        extra = {"src_prefix": codes[0], "tgt_prefix": codes[1]} if codes else {}
        lines = [line for job, start, end in parts for line in job.lines[start:end]]
        now = time.monotonic()
        for job, start, _ in parts:
            if start == 0:
                self.events.started(now - job.queued_at)
        with self._cond:
            self._in_batch = len(parts)
        self.busy = True
        try:
            results = self.translate(lines, beam=beam, lenpen=lenpen, nbest=nbest, **extra)
            if len(results) != len(lines):
                raise RuntimeError(f"translate returned {len(results)} results for {len(lines)} lines")
        except Exception as exc:  # noqa: BLE001 - find the request at fault; the worker must live on
            self._after_call(parts, seconds=None)
            if len(parts) == 1:
                self._finish(parts[0][0], error=exc)
            else:
                for part in parts:  # each alone: only the request that raises again gets the error
                    self._decode([part])
            return
        self._after_call(parts, seconds=time.monotonic() - now)
        self.lines += len(lines)
        offset = 0
        for job, start, end in parts:
            job.results.extend(results[offset : offset + end - start])
            offset += end - start
            job.done = end
            if job.done == len(job.lines):
                self._finish(job, result=job.results)

    def _after_call(self, parts: list[Part], *, seconds: float | None) -> None:
        """Bookkeeping after a translate call; ``seconds`` is None when it raised (nothing to report)."""
        self.busy = False
        self.batches += 1
        self._previous_batch_jobs, self._last_batch_jobs = self._last_batch_jobs, len(parts)
        self._last_batch_end = time.monotonic()
        with self._cond:
            self._in_batch = 0
        if seconds is None:
            return
        lines = sum(end - start for _, start, end in parts)
        tokens = sum(sum(job.tokens[start:end]) for job, start, end in parts)
        self.events.batch(requests=len(parts), lines=lines, tokens=tokens, seconds=seconds)

    def _finish(self, job: Job, *, result: list | None = None, error: BaseException | None = None) -> None:
        """Answer ``job`` (unless nobody listens) and forget it."""
        if result is not None or error is not None:
            job.resolve(result, error)
        if job in self._active:
            self._active.remove(job)
        with self._cond:
            self._pending -= 1
