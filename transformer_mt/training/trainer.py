"""`tmt train`: the training loop. It reads top to bottom: update, log, validate or save when due, stop when asked.

What it delegates: setting a run up (setup.py, which hands the loop one `Run`: run.py), one update and its batches
(step.py), the train state a checkpoint holds (state.py), which files a save writes and which checkpoint a resume
takes (policy.py), stopping on limits, signals and divergence (stopping.py), validation (validation.py), the logs
(runlog.py).

Data parallel (torchrun, WORLD_SIZE > 1): each process trains a DistributedDataParallel replica; rank 0 alone
writes train.log, metrics.jsonl, config.yaml and checkpoints, and validates (the `if run.is_main:` blocks and the
`_on_main` methods), and every rank gets the results and the patience count. What else each rank does: setup.py
(set-up, RNG), step.py (batches, loss), stopping.py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, TrainConfig
from transformer_mt.data import Batch, SampledSegmentation
from transformer_mt.model import Transformer
from transformer_mt.training.corpora import corpus_tokens
from transformer_mt.training.ema import EMA
from transformer_mt.training.finetuning import TrainedShare
from transformer_mt.training.optim import Scheduler
from transformer_mt.training.run import Run, TrainError, main_rank_work
from transformer_mt.training.run_config import train_config_from_cli
from transformer_mt.training.runlog import Window
from transformer_mt.training.setup import set_up
from transformer_mt.training.state import Progress, TrainResult, TrainState
from transformer_mt.training.step import (
    Corpus,
    UpdateBatches,
    UpdateStats,
    run_cost,
    run_update,
    sampling_line,
    target_tokens,
    update_flops,
    update_schedule,
)
from transformer_mt.training.stopping import INTERRUPTED, Divergence, Stopping, ValidationCutShort, stop_reason

OnUpdate = Callable[[int, UpdateStats], None]  # after every update: its number and its stats


def train(
    cfg: Config, *, resume: bool = False, overwrite: bool = False, on_update: OnUpdate | None = None
) -> TrainResult:
    """Train according to `cfg`; with `resume`, continue from the newest complete checkpoint in cfg.train.out_dir.
    A new run refuses a directory holding one, unless `overwrite` (its checkpoints are removed; rundir.py).
    Under torchrun (WORLD_SIZE > 1) this process is one rank of a data-parallel run."""
    return Trainer(set_up(cfg, resume=resume, overwrite=overwrite), on_update=on_update).run()


def train_from_cli(
    *,
    config: Path | None,
    overrides: list[str],
    resume: Path | None,
    overwrite: bool = False,
    init_from: Path | None = None,
) -> TrainResult:
    """`tmt train`: the config from --config (fine-tuning: with --init-from's architecture and tokenizer) or from the
    run being resumed, then train. An interrupted run returns normally with stop_reason "interrupted" (the command
    line exits 130 on it)."""
    cfg = train_config_from_cli(
        config=config, overrides=overrides, resume=resume, overwrite=overwrite, init_from=init_from
    )
    return train(cfg, resume=resume is not None, overwrite=overwrite)


class Trainer:
    """The loop over one run's parts (a `Run`, from setup.set_up); `run()` trains, and closes the run however it
    ends. `on_update` (it may be set after construction) hears of every update."""

    def __init__(self, run: Run, *, on_update: OnUpdate | None = None):
        self.parts, self.on_update = run, on_update
        self.stopping = Stopping()
        self._started = time.monotonic()  # of this session's loop (run() starts it again): the clock counts from it

    # the run's parts, as the loop and its callers (scripts, tests) use them most
    @property
    def t(self) -> TrainConfig:
        """The train config this process trains with (the dtype resolved)."""
        return self.parts.t

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @property
    def train_data(self) -> Corpus:
        return self.parts.data.train

    @property
    def state(self) -> TrainState:
        return self.parts.state

    @property
    def progress(self) -> Progress:
        return self.parts.state.progress

    @property
    def model(self) -> Transformer:
        return self.parts.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.state.optimizer

    @property
    def scheduler(self) -> Scheduler:
        return self.parts.state.scheduler

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.parts.state.scaler

    @property
    def ema(self) -> EMA | None:
        return self.parts.state.ema

    def clock(self) -> float:
        """Training seconds of the whole run (earlier sessions' included), host time (no device sync)."""
        return self.progress.elapsed + (time.monotonic() - self._started)

    def close(self) -> None:
        """Close the run (Run.close): its log, the process group it created, the run directory's lock."""
        self.parts.close()

    # ------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        # The handlers stay until the final validation and save are done: a signal there (a scheduler's
        # SIGTERM before its SIGKILL) cuts the validation short and the checkpoint is still written.
        try:
            with self.stopping.signals(verbose=self.parts.is_main):
                return self._train()
        finally:
            self.close()

    def _train(self) -> TrainResult:
        run, t, p = self.parts, self.t, self.progress
        self._started = time.monotonic()
        self.scheduler.clock = self.clock  # wsd cools down over the end of max_time on this clock
        run.runlog.start_progress(total=t.max_updates or None, initial=p.update)
        window, divergence = Window(), Divergence()
        reason = self._stop_reason()  # a resumed run may already be at its limits: then it trains no further
        world_size = run.dist.world_size
        try:
            for u in (
                ()
                if reason
                else update_schedule(self.train_data, t, world_size=world_size, epoch=p.epoch, start=p.batch_in_epoch)
            ):
                stats = self._run_update(u)
                divergence.add(stats.gnorm, scaled=self.scaler is not None)
                window.add(stats)
                run.runlog.advance()
                if self.on_update is not None:
                    self.on_update(p.update, stats)
                if self._should_log():
                    run.runlog.train(
                        update=p.update, epoch=p.epoch, wall=self.clock(), corpora=p.corpus_tokens, **window.flush()
                    )
                if self._should_validate():
                    with window.paused():  # tokens/s in the log counts training time only
                        self._validate_everywhere()
                    if self._out_of_patience():
                        reason = f"no improvement in {t.patience} validations (patience)"
                elif paths := run.policy.between_validations(p.update):  # a numbered checkpoint between validations
                    with window.paused():
                        self._save(paths)
                reason = divergence.reason() or reason  # diverged: that is the reason, patience or not
                reason = reason or self._stop_reason()
                if u.last:
                    p.epoch, p.batch_in_epoch = u.epoch + 1, 0
                if reason:
                    break
            else:  # the schedule ran out of epochs (also when resumed at the end of the last one)
                if not reason:
                    p.epoch, p.batch_in_epoch = t.max_epochs + 1, 0
                    reason = f"max_epochs={t.max_epochs} reached"
        finally:
            run.runlog.end_progress()
        return self._end(reason, diverged=divergence.diverged)

    def _run_update(self, u: UpdateBatches) -> UpdateStats:
        """This rank's share of `u` trained as one update, and the progress counted."""
        run, data = self.parts, self.train_data
        if isinstance(data, SampledSegmentation) and u.start == 0:
            run.log(sampling_line(data, u.epoch))
        mine, filler = u.rank_batches(data, run.dist.rank, run.dist.world_size, pad_to_multiple=run.t.pad_to_multiple)
        stats = self.update(mine, filler=filler, ntokens=target_tokens(data, u.batches))
        flops = update_flops(data, u.batches, run.cfg.model, vocab=self.model.output_size)
        self.progress.count_update(
            epoch=u.epoch,
            batch_in_epoch=u.start + len(u.batches),
            tokens=stats.tokens,
            flops=flops,
            seconds=stats.seconds,
            corpora=corpus_tokens(data, u.batches),
        )
        return stats

    def _should_log(self) -> bool:
        return self.progress.update % self.t.log_every == 0

    def _should_validate(self) -> bool:
        return self.parts.data.valid is not None and self.progress.update % self.t.validate_every == 0

    def _out_of_patience(self) -> bool:
        t = self.t
        return bool(t.patience) and self.progress.bad_validations >= t.patience

    def _stop_reason(self) -> str:
        run = self.parts
        return stop_reason(
            self.stopping,
            run.t,
            update=self.progress.update,
            elapsed=self.clock(),
            distributed=run.dist.enabled,
            device=run.device,
        )

    def _end(self, reason: str, *, diverged: bool) -> TrainResult:
        """The final validation (unless interrupted or diverged, or just done), the last save, the summary."""
        run, p = self.parts, self.progress
        if reason != INTERRUPTED and not diverged and run.data.valid is not None and p.last_validated != p.update:
            # an empty result: a signal cut the final validation short (on rank 0; the result reached every rank)
            if not self._validate_everywhere():
                reason = INTERRUPTED
        p.elapsed = self.clock()
        with main_rank_work():  # the others wait for the checkpoint
            if run.is_main:
                self._finish(reason)
        if diverged:
            raise TrainError(f"{run.out}: {reason}")
        return TrainResult(run.out, p, reason, self.state.metrics)

    def _finish(self, reason: str) -> None:
        """Rank 0: the last save, then the summary record and the lines that end the session's log."""
        run = self.parts
        run.policy.save(self.state.state_dict(), run.policy.at_end())
        if run.compiler is not None:  # what train.compile compiled, and how often
            run.log(run.compiler.summary())
        cost = run_cost(self.progress, run.t, device=run.device, world_size=run.dist.world_size)
        share = TrainedShare.of(self.state.model)
        if share.frozen:  # LoRA or frozen parts: what trained, in the summary record and the log's last lines
            cost = {**cost, **share.as_record()}
            run.log(share.describe())
        run.runlog.end(
            self.progress,
            reason=reason,
            interrupted=reason == INTERRUPTED,
            last_valid=self.state.metrics,
            cost=cost,
            out=run.out,
        )

    # ------------------------------------------------------------ one update
    def update(self, batches: list[Batch], *, filler: Batch | None = None, ntokens: int | None = None) -> UpdateStats:
        """One optimizer update over this rank's `batches` (step.run_update says what the arguments mean); the stats
        summed over all ranks, the loss and nll as floats when an `on_update` hook reads them."""
        run = self.parts
        return run_update(
            run.state,
            run.train_model,
            batches,
            filler=filler,
            ntokens=ntokens,
            dist=run.dist,
            device=run.device,
            host_stats=self.on_update is not None,
            log=run.log,
        )

    # ------------------------------------------------------------ validation and saves
    def validate(self) -> dict[str, float]:
        """The model's validation results (validation.Validator); ValidationCutShort when a stop cuts it short."""
        validator = self.parts.data.validator
        assert validator is not None
        return validator(self.model, ema=self.ema, stopping=self.stopping, dtype=self.t.dtype)

    def _validate_everywhere(self) -> dict[str, float]:
        """Validate and save on rank 0; every rank gets the results and the patience bookkeeping."""
        p, wall = self.progress, self.clock()
        shared = runtime.on_main(functools.partial(self._validate_and_save_on_main, wall))
        self.state.metrics, p.best, p.bad_validations, p.last_validated = shared
        return self.state.metrics

    def _validate_and_save_on_main(self, wall: float) -> tuple[dict[str, float], float | None, int, int]:
        """Rank 0: validate, then save (policy.after_validation). Returns the results ({} when a stop cut the
        validation short: nothing is saved here, the run stops and saves checkpoint_last.pt) and the patience
        bookkeeping after them, which every rank takes."""
        run, p, tic = self.parts, self.progress, time.perf_counter()
        try:
            val = self.validate()
        except ValidationCutShort:
            run.log(f"validation at update {p.update} cut short by the signal; saving without it")
            return {}, p.best, p.bad_validations, p.last_validated
        improved = run.policy.improves(val, p.best)
        p.validated(run.policy.score(val)[0], improved=improved)
        run.runlog.valid(
            update=p.update, epoch=p.epoch, wall=wall, val=val, best=improved, seconds=time.perf_counter() - tic
        )
        self.state.metrics = val
        run.policy.save(self.state.state_dict(elapsed=wall), run.policy.after_validation(p.update, improved=improved))
        return val, p.best, p.bad_validations, p.last_validated

    def _save(self, paths: list[Path]) -> None:
        """Rank 0 saves the train state under `paths` (every save is resumable: --resume takes the newest); the
        others wait for it."""
        run, wall = self.parts, self.clock()
        with main_rank_work():
            if run.is_main:
                run.policy.save(self.state.state_dict(elapsed=wall), paths)
