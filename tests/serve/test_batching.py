"""The batch queue alone, no HTTP: fair chunks, per-request failure, dropped jobs, grouping and bounds.

The translate functions are instrumented fakes that record every call and can hold the worker until the
test lets it go, so every assertion is about order and content, never about time.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from transformer_mt.serve.batching import Batcher, Job, QueueFull, Stopped


class Recorder:
    """translate(lines, ...) -> "LINE|beam" per line; records each call; holds calls while ``gate`` is closed."""

    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple[tuple[str, ...], int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_on = fail_on

    def __call__(self, lines, *, beam, **_settings):
        self.calls.append((tuple(lines), beam))
        self.entered.set()
        assert self.gate.wait(10), "the test never released the worker"
        if self.fail_on is not None and self.fail_on in lines:
            raise ValueError(f"cannot translate {self.fail_on!r}")
        return [[(0.0, f"{line.upper()}|{beam}")] for line in lines]

    async def hold(self) -> None:
        """Close the gate and wait until the worker is inside a call."""
        while not self.entered.is_set():
            await asyncio.sleep(0.005)


def make_job(loop, lines, *, beam=1, deadline=float("inf")) -> Job:
    return Job(list(lines), (beam, 0.0, 1), loop.create_future(), loop, deadline=deadline)


def texts(result) -> list[str]:
    return [nb[0][1] for nb in result]


def test_a_small_request_after_a_huge_one_is_answered_before_the_huge_one_ends():
    """A 40-line request is decoded in chunks of the token budget; a one-line request submitted while its
    first chunk runs rides in the very next batch, and finishes while the large one still has chunks left."""
    fake = Recorder()
    fake.gate.clear()
    finished: list[str] = []

    async def scenario():
        loop = asyncio.get_running_loop()
        b = Batcher(fake, name="m", max_queue=8, batch_tokens=30, wait_s=0.0)  # count_words: "w w" = 3 tokens a line
        huge = make_job(loop, [f"h{i} x" for i in range(40)])
        small = make_job(loop, ["s x"])
        huge.future.add_done_callback(lambda _f: finished.append("huge"))
        small.future.add_done_callback(lambda _f: finished.append("small"))
        b.submit(huge)
        await fake.hold()  # the worker decodes the huge request's first chunk
        b.submit(small)
        fake.gate.set()
        results = await asyncio.gather(huge.future, small.future)
        await asyncio.to_thread(b.stop)
        return results

    huge_result, small_result = asyncio.run(scenario())
    assert finished == ["small", "huge"]
    assert fake.calls[0] == (tuple(f"h{i} x" for i in range(10)), 1)  # the whole budget when alone: 10 lines x 3 tokens
    assert fake.calls[1][0][0] == "s x"  # the next batch starts with the newcomer, then 5 huge lines (half the budget)
    assert fake.calls[1][0][1:] == tuple(f"h{i} x" for i in range(10, 15))
    # every line, in order
    assert texts(huge_result) == [f"H{i} X|1" for i in range(40)] and texts(small_result) == ["S X|1"]


def test_a_batch_that_raises_is_retried_per_request_and_only_the_culprit_fails():
    fake = Recorder(fail_on="boom")
    fake.gate.clear()

    async def scenario():
        loop = asyncio.get_running_loop()
        b = Batcher(fake, name="m", max_queue=8, batch_tokens=10_000, wait_s=0.0)
        first = make_job(loop, ["first"])
        b.submit(first)
        await fake.hold()
        jobs = [make_job(loop, ["a", "b"]), make_job(loop, ["x", "boom"]), make_job(loop, ["c"])]
        for job in jobs:
            b.submit(job)
        fake.gate.set()
        outcomes = await asyncio.gather(first.future, *(j.future for j in jobs), return_exceptions=True)
        assert b.alive  # the worker lives on
        await asyncio.to_thread(b.stop)
        return b, outcomes

    b, (first, ab, boom, c) = asyncio.run(scenario())
    assert texts(first) == ["FIRST|1"] and texts(ab) == ["A|1", "B|1"] and texts(c) == ["C|1"]
    assert isinstance(boom, ValueError) and "boom" in str(boom)
    # one call for the three together (it raised), then each request alone
    assert fake.calls[1:] == [(("a", "b", "x", "boom", "c"), 1), (("a", "b"), 1), (("x", "boom"), 1), (("c",), 1)]


def test_dropped_jobs_leave_the_queue_and_the_running_work_between_chunks():
    """A job whose client left (drop) is never decoded; one whose deadline passed loses its remaining chunks."""
    fake = Recorder()
    fake.gate.clear()

    async def scenario():
        loop = asyncio.get_running_loop()
        b = Batcher(fake, name="m", max_queue=8, batch_tokens=6, wait_s=0.0)  # 2 lines of "w w" per chunk
        long = make_job(loop, [f"l{i} x" for i in range(8)])
        b.submit(long)
        await fake.hold()  # chunk 1 of 4 is being decoded
        gone = make_job(loop, ["gone x"])
        b.submit(gone)
        gone.drop("disconnected")  # as the server does when the client's connection closes
        long.deadline = 0.0  # its deadline passed while chunk 1 ran
        later = make_job(loop, ["later x"])
        b.submit(later)
        fake.gate.set()
        answer = await later.future
        await asyncio.to_thread(b.stop)
        return b, long, gone, answer

    b, long, gone, answer = asyncio.run(scenario())
    decoded = [line for lines, _ in fake.calls for line in lines]
    assert decoded == ["l0 x", "l1 x", "later x"]  # nothing of the dropped job, nothing after the deadline
    assert texts(answer) == ["LATER X|1"] and not long.future.done() and not gone.future.done()
    assert b.dropped == 2 and b.waiting == 0


def test_groups_by_settings_keeps_order_refuses_when_full_and_stop_drains():
    fake = Recorder()
    fake.gate.clear()

    async def scenario():
        loop = asyncio.get_running_loop()
        b = Batcher(fake, name="m", max_queue=4, batch_tokens=10_000, wait_s=0.0)
        first = make_job(loop, ["x"])
        b.submit(first)
        await fake.hold()
        assert b.ready()
        queued = [
            make_job(loop, ["a", "b"]),
            make_job(loop, ["c"], beam=4),
            make_job(loop, ["d", "e", "f"]),
            make_job(loop, ["g"], beam=4),
        ]
        for job in queued:
            b.submit(job)
        assert not b.ready() and b.waiting == 4  # the running job does not count
        with pytest.raises(QueueFull):
            b.submit(make_job(loop, ["h"]))
        fake.gate.set()
        results = [await j.future for j in [first, *queued]]
        await asyncio.to_thread(b.stop)
        with pytest.raises(Stopped):
            b.submit(make_job(loop, ["i"]))
        return b, results

    b, results = asyncio.run(scenario())
    assert [texts(r) for r in results] == [["X|1"], ["A|1", "B|1"], ["C|4"], ["D|1", "E|1", "F|1"], ["G|4"]]
    assert fake.calls == [(("x",), 1), (("a", "b", "d", "e", "f"), 1), (("c", "g"), 4)]
    assert (b.requests, b.batches, b.lines, b.rejected) == (5, 3, 8, 1)
    assert not b.alive and not b.ready()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_refuses_and_is_not_ready():
    def translate(lines, **_settings):
        raise SystemExit  # not an Exception: escapes the worker's guard, as a bug in the worker itself would

    async def scenario():
        loop = asyncio.get_running_loop()
        b = Batcher(translate, name="m", max_queue=4, batch_tokens=100, wait_s=0.0)
        b.submit(make_job(loop, ["x"]))
        await asyncio.to_thread(b._thread.join, 10)
        assert not b.alive and not b.ready()
        with pytest.raises(Stopped):
            b.submit(make_job(loop, ["y"]))

    asyncio.run(scenario())


def test_the_worker_sets_up_its_own_thread_before_decoding(tiny_checkpoint):
    """torch's CPU threads are per calling thread: serve_model(threads=N) makes the worker thread decode with N,
    whatever the thread that built the model uses."""
    import torch

    from transformer_mt.decoding import Translator
    from transformer_mt.serve import ServeOptions
    from transformer_mt.serve.models import serve_model

    seen: list[tuple[str, int]] = []

    def translate(lines, **_settings):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return [[(0.0, line)] for line in lines]

    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    served = serve_model(
        "m",
        Translator.from_checkpoint(tiny_checkpoint, device="cpu"),
        ServeOptions(),
        translate=translate,
        threads=want,
    )

    async def scenario():
        loop = asyncio.get_running_loop()
        job = make_job(loop, ["a b"])
        served.batcher.submit(job)
        return await job.future

    try:
        assert texts(asyncio.run(scenario())) == ["a b"]
    finally:
        served.batcher.stop(timeout=5)
    assert seen == [("tmt-batcher-m", want)] and torch.get_num_threads() == before  # the caller's thread is untouched
