"""Stopping a run: the limits, and SIGINT/SIGTERM, which only ask the loop to stop.

A signal handler sets a flag and returns. An exception raised from a handler would surface wherever the
main thread happens to be: halfway through swapping the EMA weights in (the raw ones lost), or through a
save. The loop reads the flag at safe points instead: after every update (`stop_reason`), and inside a
validation before each batch's encoder pass (`Stopping.checked_before`), where a stop raises
`ValidationCutShort` through code that undoes what it changed (the EMA swap restores the raw weights).

What the user sees: the first signal finishes the update (or cuts a validation short), saves
checkpoint_last.pt and exits (`tmt train` with 130); that holds through the final validation and save too.
A second SIGINT aborts at once (Python's own KeyboardInterrupt): checkpoints are written atomically, so the
last one stays intact. Under DDP a signal may reach one rank only, and clocks differ: the stop conditions
are summed across ranks once per update, so all ranks stop after the same update.
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Iterator

import torch

from transformer_mt import runtime
from transformer_mt.config import TrainConfig
from transformer_mt.training.runlog import echo

INTERRUPTED = "interrupted"

# Updates in a row whose gradient norm is not finite (each skipped by the NaN guard) before the run stops:
# one such update is a spike to step over; ten in a row is a diverged run that would skip updates for ever.
MAX_NONFINITE_UPDATES = 10


class ValidationCutShort(BaseException):
    """Raised at a safe point of a validation when a stop was asked for: stop validating, save, exit.
    A BaseException so that no `except Exception` on the way swallows it."""


class Stopping:
    """Whether a stop was asked for (by a signal, or by `request`)."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        """Stop after this update; inside a validation, at its next safe point."""
        self.requested = True

    def check(self) -> None:
        """A safe point of a validation: raise ValidationCutShort when a stop was asked for."""
        if self.requested:
            raise ValidationCutShort

    @contextlib.contextmanager
    def checked_before(self, module: torch.nn.Module) -> Iterator[None]:
        """Inside the block, `check()` before every forward of `module`: given a model's first encoder layer, once
        per batch of a validation (its loss and its BLEU search alike)."""
        handle = module.register_forward_pre_hook(lambda *_: self.check())
        try:
            yield
        finally:
            handle.remove()

    @contextlib.contextmanager
    def signals(self, *, verbose: bool = True) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop inside the block; `verbose`: say so on stderr. Not in the main
        thread (some test runners), signals cannot be handled: none are installed."""

        def handler(signum, frame):  # noqa: ARG001 - signal handler signature
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts
            self.request()
            if verbose:  # a closed or full stderr must not turn the message into an exception here
                with contextlib.suppress(OSError, ValueError):
                    echo(
                        f"\n{signal.Signals(signum).name} received: finishing this update and saving a checkpoint "
                        "(Ctrl-C again to abort)"
                    )

        previous = {}
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def stop_reason(
    stopping: Stopping, t: TrainConfig, *, update: int, elapsed: float, distributed: bool, device: torch.device
) -> str:
    """Why to stop after this update ("" = go on): a signal or a limit; the same on every rank."""
    reason = INTERRUPTED if stopping.requested else ""
    if not reason and t.max_updates and update >= t.max_updates:
        reason = f"max_updates={t.max_updates} reached"
    elif not reason and t.max_time and elapsed >= t.max_time * 60:
        reason = f"max_time={t.max_time:g} minutes reached"
    if not distributed:
        return reason
    interrupted, limited = runtime.all_reduce_sum([float(reason == INTERRUPTED), float(bool(reason))], device)
    if interrupted:
        return INTERRUPTED
    return (reason or f"max_time={t.max_time:g} minutes reached on another rank") if limited else ""


class Divergence:
    """The updates in a row that the NaN guard skipped (with fp16 loss scaling a non-finite norm is an overflow
    that the scaler handles, never counted). The gradient norm is the same on every rank (after the all-reduce),
    so every rank counts alike and stops after the same update."""

    def __init__(self) -> None:
        self.in_a_row = 0

    def add(self, gnorm: float, *, scaled: bool) -> None:
        self.in_a_row = self.in_a_row + 1 if not scaled and not math.isfinite(gnorm) else 0

    @property
    def diverged(self) -> bool:
        return self.in_a_row >= MAX_NONFINITE_UPDATES

    def reason(self) -> str:
        """Why to stop ("" = go on): MAX_NONFINITE_UPDATES skipped updates in a row."""
        if not self.diverged:
            return ""
        return (
            f"diverged: the last {self.in_a_row} updates all had a non-finite gradient norm and were skipped "
            "(NaN guard); "
            "the model is saved as it was before them; lower train.lr, raise train.warmup_updates or check the data"
        )
