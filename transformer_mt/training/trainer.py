"""`tmt train`: the training loop. It reads top to bottom: update, log, validate or save when due, stop when asked.

What it delegates: setting a run up (setup.py), one update and its batches (step.py), the train state a
checkpoint holds (state.py), which files a save writes and which checkpoint a resume takes (policy.py),
stopping on limits, signals and divergence (stopping.py), validation (validation.py), the logs (runlog.py).

Data parallel (torchrun, WORLD_SIZE > 1): each process trains a DistributedDataParallel replica; rank 0 alone
writes train.log, metrics.jsonl, config.yaml and checkpoints, and validates, and every rank gets the results
and the patience count. What else each rank does: setup.py (set-up, RNG), step.py (batches, loss), stopping.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, save_config
from transformer_mt.data import Batch, SampledSegmentation
from transformer_mt.model import count_parameters
from transformer_mt.training import setup
from transformer_mt.training.policy import CheckpointPolicy
from transformer_mt.training.rundir import RunLock
from transformer_mt.training.runlog import RunLog, Window
from transformer_mt.training.state import TrainResult
from transformer_mt.training.step import (
    UpdateBatches,
    run_cost,
    run_update,
    sampling_line,
    target_tokens,
    update_flops,
    update_schedule,
)
from transformer_mt.training.stopping import INTERRUPTED, Divergence, Stopping, ValidationCutShort, stop_reason
from transformer_mt.training.validation import Validator


def train(
    cfg: Config, *, resume: bool = False, overwrite: bool = False, on_update: Callable[[int, dict], None] | None = None
) -> TrainResult:
    """Train according to `cfg`; with `resume`, continue from the newest complete checkpoint in cfg.train.out_dir.
    A new run refuses a directory holding one, unless `overwrite` (its checkpoints are removed; rundir.py).
    Under torchrun (WORLD_SIZE > 1) this process is one rank of a data-parallel run."""
    return Trainer(cfg, resume=resume, overwrite=overwrite, on_update=on_update).run()


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
    cfg = setup.train_config_from_cli(
        config=config, overrides=overrides, resume=resume, overwrite=overwrite, init_from=init_from
    )
    return train(cfg, resume=resume is not None, overwrite=overwrite)


class Trainer:
    """One run: its train state, data and logs (set up by setup.py); `run()` is the loop."""

    def __init__(
        self,
        cfg: Config,
        *,
        resume: bool,
        overwrite: bool = False,
        on_update: Callable[[int, dict], None] | None = None,
    ):
        self.cfg, self.out, self.on_update = cfg, Path(cfg.train.out_dir), on_update
        self.dist, self.runlog = (
            runtime.dist_info(),
            RunLog(None),
        )  # the log is silent until rank 0 opens the run directory
        self.lock: RunLock | None = None  # rank 0's, on the run directory
        self._old_run: list[
            Path
        ] = []  # rank 0's: the checkpoints --overwrite removes once the new run passed its checks
        self.stopping, self.policy = Stopping(), CheckpointPolicy(self.out, cfg.train)
        self.t, self.device, self._owns_group = setup.process(
            cfg, self.dist
        )  # the train config with the dtype resolved
        try:
            self._setup(resume, overwrite)
        except BaseException:
            self.close()
            raise

    def _setup(self, resume: bool, overwrite: bool) -> None:
        cfg, t, main = self.cfg, self.t, self.dist.is_main
        runtime.on_main(lambda: self._open_run_dir(resume, overwrite))
        runtime.seed_everything(t.seed)  # the same on every rank: identical initial parameters
        saved, init = None, None
        if resume:
            self.resumed_from, saved = setup.resume_point(self.out, log=self.log)
        else:
            init = setup.init_point(cfg, log=self.log)
        source = saved or (init[1] if init else None)
        self.src_tok, self.tgt_tok = setup.tokenizers(
            cfg, source, source=str(self.resumed_from if saved else cfg.train.init_from), log=self.log
        )
        self.state = setup.build_state(cfg, t, (self.src_tok, self.tgt_tok), device=self.device, keeps_ema=main)
        if saved is not None:  # rank r > 0 reseeds below instead of restoring the generators
            setup.restore(self.state, saved, source=self.resumed_from, restore_rng=main, runlog=self.runlog)
        elif init is not None:
            setup.initialize(self.state, init[1], source=init[0])
        if self.dist.rank > 0:  # its own dropout masks; rank 0 keeps the single-process stream
            runtime.seed_everything(runtime.seed_for_rank(t.seed, self.dist.rank, self.progress.update))
        quiet = not sys.stderr.isatty() or not main
        self.train_data, self.valid_data = setup.load_data(
            cfg, self.state, self.src_tok, self.tgt_tok, resumed=saved is not None, quiet=quiet, log=self.log
        )
        setup.check_valid_beam(t, validates_bleu=self.valid_data is not None, tgt_vocab_size=self.tgt_tok.vocab_size)
        self.validator = (
            None
            if self.valid_data is None
            else Validator(cfg, self.valid_data, (self.src_tok, self.tgt_tok), device=self.device, log=self.log)
        )
        setup.check_batching(self.progress, setup.batching_of(cfg, self.train_data), log=self.log)
        self.train_model, where = setup.training_module(self.model, t, dist=self.dist, device=self.device)
        # every check has passed: only now is an old run removed (--overwrite) and its config replaced
        runtime.on_main(lambda: setup.start_over(self.out, self._old_run, self.runlog, resume=resume))
        runtime.on_main(lambda: save_config(cfg, self.out / "config.yaml"))
        self.log(
            f"model: {count_parameters(self.model):,} parameters; device {self.device}, dtype {t.dtype}, {torch.get_num_threads()} threads{where}"
        )

    def _open_run_dir(self, resume: bool, overwrite: bool) -> None:
        self.lock, self.runlog, self._old_run = setup.open_run_dir(self.out, self.t, resume=resume, overwrite=overwrite)

    def log(self, msg: str) -> None:
        self.runlog.log(msg)

    # the train state's parts, as the loop and its callers (scripts, tests) use them
    model = property(lambda self: self.state.model)
    optimizer = property(lambda self: self.state.optimizer)
    scheduler = property(lambda self: self.state.scheduler)
    scaler = property(lambda self: self.state.scaler)
    ema = property(lambda self: self.state.ema)
    progress = property(lambda self: self.state.progress)

    def close(self) -> None:
        """Close the run log and leave the process group this trainer created."""
        self.runlog.close()
        # Drop DDP first: were its reducer the last holder of the Gloo group, the group's destructor
        # would wait for Gloo's threads while holding the GIL they may need (a deadlock at exit).
        if hasattr(self, "train_model"):
            self.train_model = self.state.model
        if self._owns_group:
            runtime.shutdown_distributed()
            self._owns_group = False
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        # The handlers stay until the final validation and save are done: a signal there (a scheduler's
        # SIGTERM before its SIGKILL) cuts the validation short and the checkpoint is still written.
        try:
            with self.stopping.signals(verbose=self.dist.is_main):
                return self._train()
        finally:
            self.close()

    def _train(self) -> TrainResult:
        t, p = self.t, self.progress
        start = time.monotonic()
        self.clock = lambda: (
            p.elapsed + (time.monotonic() - start)
        )  # training seconds of the whole run, host time (no device sync)
        self.scheduler.clock = self.clock  # wsd cools down over the end of max_time on this clock
        self.runlog.start_progress(total=t.max_updates or None, initial=p.update)
        window, divergence = Window(), Divergence()
        reason = self._stop_reason()  # a resumed run may already be at its limits: then it trains no further
        try:
            for u in (
                ()
                if reason
                else update_schedule(
                    self.train_data, t, world_size=self.dist.world_size, epoch=p.epoch, start=p.batch_in_epoch
                )
            ):
                stats = self._run_update(u)
                divergence.add(stats["gnorm"], scaled=self.scaler is not None)
                window.add(stats)
                self.runlog.advance()
                if self.on_update is not None:
                    self.on_update(p.update, stats)
                if self._should_log():
                    self.runlog.train(update=p.update, epoch=p.epoch, wall=self.clock(), **window.flush())
                if self._should_validate():
                    with window.paused():  # tokens/s in the log counts training time only
                        self._validate_everywhere()
                    if self._out_of_patience():
                        reason = f"no improvement in {t.patience} validations (patience)"
                elif paths := self.policy.between_validations(p.update):  # a numbered checkpoint between validations
                    with window.paused():
                        self._save_on_main(paths)
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
            self.runlog.end_progress()
        return self._end(reason, diverged=divergence.diverged)

    def _run_update(self, u: UpdateBatches) -> dict:
        """This rank's share of `u` trained as one update, and the progress counted."""
        data, p = self.train_data, self.progress
        if isinstance(data, SampledSegmentation) and u.start == 0:
            self.log(sampling_line(data, u.epoch))
        mine, filler = u.rank_batches(data, self.dist.rank, self.dist.world_size)
        stats = self.update(mine, filler=filler, ntokens=target_tokens(data, u.batches))
        flops = update_flops(data, u.batches, self.cfg.model, vocab=self.model.output_size)
        p.count_update(
            epoch=u.epoch,
            batch_in_epoch=u.start + len(u.batches),
            tokens=stats["ntokens"],
            flops=flops,
            seconds=stats["seconds"],
        )
        return stats

    def _should_log(self) -> bool:
        return self.progress.update % self.t.log_every == 0

    def _should_validate(self) -> bool:
        return self.valid_data is not None and self.progress.update % self.t.validate_every == 0

    def _out_of_patience(self) -> bool:
        return bool(self.t.patience) and self.progress.bad_validations >= self.t.patience

    def _stop_reason(self) -> str:
        return stop_reason(
            self.stopping,
            self.t,
            update=self.progress.update,
            elapsed=self.clock(),
            distributed=self.dist.enabled,
            device=self.device,
        )

    def _end(self, reason: str, *, diverged: bool) -> TrainResult:
        """The final validation (unless interrupted or diverged, or just done), the last save, the summary."""
        p = self.progress
        if reason != INTERRUPTED and not diverged and self.valid_data is not None and p.last_validated != p.update:
            if (
                not self._validate_everywhere()
            ):  # a signal cut the final validation short (on rank 0; the empty result reached every rank)
                reason = INTERRUPTED
        p.elapsed = self.clock()
        runtime.on_main(lambda: self._finish(reason))  # the others wait for the checkpoint
        if diverged:
            raise setup.TrainError(f"{self.out}: {reason}")
        return TrainResult(self.out, p, reason, self.state.metrics)

    def _finish(self, reason: str) -> None:
        self.policy.save(self.state.state_dict(), self.policy.at_end())
        cost = run_cost(self.progress, self.t, device=self.device, world_size=self.dist.world_size)
        self.runlog.end(
            self.progress,
            reason=reason,
            interrupted=reason == INTERRUPTED,
            last_valid=self.state.metrics,
            cost=cost,
            out=self.out,
        )

    # ------------------------------------------------------------ one update
    def update(self, batches: list[Batch], *, filler: Batch | None = None, ntokens: int | None = None) -> dict:
        """One optimizer update over this rank's `batches` (step.run_update says what the arguments mean); the stats summed over all ranks."""
        host_stats = self.on_update is not None
        return run_update(
            self.state,
            self.train_model,
            batches,
            filler=filler,
            ntokens=ntokens,
            dist=self.dist,
            device=self.device,
            host_stats=host_stats,
            log=self.log,
        )

    # ------------------------------------------------------------ validation and saves
    def validate(self) -> dict[str, float]:
        """The model's validation results (validation.Validator); ValidationCutShort when a stop cuts it short."""
        assert self.validator is not None
        return self.validator(self.model, ema=self.ema, stopping=self.stopping, dtype=self.t.dtype)

    def _validate_everywhere(self) -> dict[str, float]:
        """Validate and save on rank 0; every rank gets the results and the patience bookkeeping."""
        p, wall = self.progress, self.clock()
        # a tuple is built left to right: the bookkeeping is read after rank 0's validation and save updated it
        shared = runtime.on_main(lambda: (self._validate_and_save(wall), p.best, p.bad_validations, p.last_validated))
        self.state.metrics, p.best, p.bad_validations, p.last_validated = shared
        return self.state.metrics

    def _validate_and_save(self, wall: float) -> dict[str, float]:
        """Validate, then save (policy.after_validation); {} when a stop cut the validation short (nothing saved
        here: the run stops and saves checkpoint_last.pt)."""
        p, tic = self.progress, time.perf_counter()
        try:
            val = self.validate()
        except ValidationCutShort:
            self.log(f"validation at update {p.update} cut short by the signal; saving without it")
            return {}
        improved = self.policy.improves(val, p.best)
        p.validated(self.policy.score(val)[0], improved=improved)
        self.runlog.valid(
            update=p.update, epoch=p.epoch, wall=wall, val=val, best=improved, seconds=time.perf_counter() - tic
        )
        self.state.metrics = val
        self.policy.save(self.state.state_dict(elapsed=wall), self.policy.after_validation(p.update, improved=improved))
        return val

    def _save_on_main(self, paths: list[Path]) -> None:
        """Rank 0 saves the train state under `paths` (every save is resumable: --resume takes the newest)."""
        wall = self.clock()
        runtime.on_main(lambda: self.policy.save(self.state.state_dict(elapsed=wall), paths))
