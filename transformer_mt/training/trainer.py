"""`tmt train`: the teacher-forced training loop, validation, checkpoints and exact resume.

One update = `update_freq` token-budget batches whose gradients are summed, normalised by the
update's target-token count, clipped, and applied by Adam under the warm-up schedule.
Everything needed to continue exactly (weights, optimizer, scheduler, scaler, RNG states,
epoch and position in the epoch) goes into every checkpoint, written atomically; each save (a
validation, `save_every`, the end) also writes `checkpoint_last.pt`, after `checkpoint_best.pt`.
`--resume` continues from the newest complete checkpoint; the run directory is locked, and a
new run refuses one that holds a run unless `--overwrite` (rundir.py). A resume says what changed
(optimizer settings: applied; batching: the epoch restarts) and drops metrics.jsonl records of
updates after its checkpoint. SIGINT/SIGTERM: finish the update (or cut a validation short), save,
exit; that holds through the final validation and save too. Ten non-finite updates in a row
(MAX_NONFINITE_UPDATES) stop a diverged run.

Data parallel. Launched by torchrun with WORLD_SIZE > 1, each process joins the job (NCCL on
GPUs, one GPU per process; Gloo on CPU) and trains a DistributedDataParallel replica:
- Batches. Every rank computes the same epoch batch list (a function of seed and epoch); an
  update consumes the next world_size x update_freq batches of it, rank r taking those at
  positions r, r + world_size, ... (`update_schedule` and `UpdateBatches.share`). So an update sees exactly the batches of one process with
  update_freq x world_size, and `Progress.batch_in_epoch` counts these global batches: a
  checkpoint saved under one world size resumes under any other.
- Epoch remainder. When the last window of an epoch holds fewer batches than ranks, a rank
  left without one runs the window's first batch with weight 0, so that it takes part in the
  gradient all-reduce; no batch is dropped or repeated.
- Loss. The update's target tokens are summed over ranks and each rank's loss is divided by
  that sum, times world_size because DDP averages gradients: the gradient is that of one
  process on the whole global batch. Only the last micro-batch of an update all-reduces.
- Rank 0 alone trains the tokenizer (the others receive it), writes train.log, metrics.jsonl
  (a `RunLog`, schema in runlog.py), config.yaml and checkpoints, and validates; results and patience are shared with all ranks.
  It encodes the corpus cache first, the others then read it. Other ranks print only errors.
- Stopping. A SIGINT/SIGTERM on any rank, or max_time on any rank's clock, is summed across
  ranks once per update: all ranks stop after the same update and rank 0 saves.
- RNG on resume: rank 0 restores the checkpoint's generator states; rank r > 0 reseeds with
  runtime.seed_for_rank(seed, r, update), as at the start of a run (update 0). Batch order
  never depends on these generators, only dropout does, so a resumed multi-process run with
  dropout differs from an uninterrupted one in the dropout masks of ranks > 0 only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import torch

from transformer_mt import runtime
from transformer_mt.checkpoint import (
    config_from_checkpoint,
    copy_checkpoint,
    load_checkpoint,
    numbered_checkpoint_path,
    pack_tokenizers,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unpack_tokenizers,
)
from transformer_mt.config import Config, ConfigError, TrainConfig, load_config, save_config, to_dict
from transformer_mt.data import Batch, SampledSegmentation, load_corpora, prepare_tokenizers
from transformer_mt.decoding import max_beam
from transformer_mt.errors import TmtError
from transformer_mt.evaluation import BleuSet, bleu_set, checked_validation_set, validation_bleu, validation_loss
from transformer_mt.model import TeacherForcedLoss, Transformer, count_parameters
from transformer_mt.runtime import flops
from transformer_mt.text import Tokenizer
from transformer_mt.training.ema import EMA
from transformer_mt.training.optim import build_optimizer, build_scheduler, restore_optimizer
from transformer_mt.training.rundir import RunLock, newest_checkpoint, remove_stale_temporaries, start_new_run
from transformer_mt.training.runlog import RunLog, Window, echo


class TrainError(TmtError, RuntimeError):
    """A training problem worded for the user."""


# Updates in a row whose gradient norm is not finite (each skipped by the NaN guard) before the run stops:
# one such update is a spike to step over; ten in a row is a diverged run that would skip updates for ever.
MAX_NONFINITE_UPDATES = 10


class _ValidationInterrupted(BaseException):
    """Raised by the signal handler inside a validation: stop validating, save, exit (BaseException: no
    `except Exception` on the way may swallow it)."""


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint so a resumed run continues exactly."""

    update: int = 0  # optimizer updates done
    epoch: int = 1  # current epoch (1-based)
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    best: float | None = None  # best validation metric so far
    bad_validations: int = 0  # validations without improvement (for patience)
    elapsed: float = 0.0  # training seconds before this process started
    last_validated: int = -1  # update of the last validation
    tokens: int = 0  # target tokens trained on (pieces + EOS, all ranks)
    flops: float = 0.0  # analytic training FLOPs, 3 x forward of every padded batch (flops.py; all ranks)
    update_seconds: float = 0.0  # seconds inside updates (validation and checkpoints excluded)
    batching: str = ""  # what the epoch's batch lists depend on (Trainer._batching); a resume checks it before using batch_in_epoch


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports."""

    out_dir: Path
    progress: Progress
    stop_reason: str
    last_validation: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- entry points
def train_from_cli(*, config: Path | None, overrides: list[str], resume: Path | None, overwrite: bool = False) -> TrainResult:
    """Build the config (from --config, or from the run being resumed) and train. An interrupted run
    returns normally with stop_reason "interrupted" (the command line exits 130 on it)."""
    if resume is not None and overwrite:
        raise ConfigError(f"--overwrite starts a new run, --resume {resume} continues one; give one of them")
    if resume is not None:
        cfg = resumed_config(resume, overrides)
        if config is not None and runtime.dist_info().is_main:
            print(f"tmt train: resuming {resume}: its saved config is used, --config {config} is ignored (use --set to change values)", file=sys.stderr)
    else:
        if config is None:
            raise ConfigError("tmt train needs --config FILE (see configs/) or --resume RUN_DIR")
        cfg = load_config(config, overrides)
    return train(cfg, resume=resume is not None, overwrite=overwrite)


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in the run's newest checkpoint (rundir.newest_checkpoint), with --set overrides
    that do not change the architecture."""
    path, state = newest_checkpoint(run_dir)
    saved = config_from_checkpoint(state, source=str(path))
    cfg = load_config(None, [f"{s}.{k}={json.dumps(v)}" for s, sec in to_dict(saved).items() for k, v in sec.items()] + list(overrides), check_files=False)
    if cfg.model != saved.model or cfg.tokenizer != saved.tokenizer:
        raise ConfigError(f"--resume {run_dir}: model.* and tokenizer.* cannot change when resuming; start a new run in another train.out_dir")
    cfg.train.out_dir = str(run_dir)
    return cfg


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False, on_update: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Train according to `cfg`; with `resume`, continue from the newest complete checkpoint in cfg.train.out_dir.
    A new run refuses a directory holding one, unless `overwrite` (its checkpoints are removed; rundir.py).
    Under torchrun (WORLD_SIZE > 1) this process is one rank of a data-parallel run."""
    return Trainer(cfg, resume=resume, overwrite=overwrite, on_update=on_update).run()


# ---------------------------------------------------------------- the batches of each update
@dataclass(frozen=True)
class UpdateBatches:
    """The global batches of one update: consecutive batches of its epoch's list."""

    epoch: int
    start: int  # position of its first batch in the epoch's batch list
    batches: list  # index arrays (ParallelData.get_batch), at most world_size x update_freq of them
    last: bool  # it ends the epoch

    def share(self, rank: int, world_size: int) -> list:
        """Rank r's batches: positions r, r + world_size, ...; empty for a rank left without one at an epoch's end."""
        return self.batches[rank::world_size]


def update_schedule(data, t: TrainConfig, *, world_size: int = 1, epoch: int = 1, start: int = 0) -> Iterator[UpdateBatches]:
    """Every update's batches in training order, from batch `start` of `epoch` on, until t.max_epochs
    (0: for ever). The same on every rank, and for one process with update_freq x world_size."""
    per_update = world_size * t.update_freq
    while not t.max_epochs or epoch <= t.max_epochs:
        batches = data.batches(epoch, max_tokens=t.max_tokens, seed=t.seed)
        for i in range(start, len(batches), per_update):
            yield UpdateBatches(epoch, i, batches[i : i + per_update], last=i + per_update >= len(batches))
        epoch, start = epoch + 1, 0


# ---------------------------------------------------------------- the trainer
class Trainer:
    """Holds the model, optimizer and data of one run; `run()` is the loop."""

    def __init__(self, cfg: Config, *, resume: bool, overwrite: bool = False, on_update: Callable[[int, dict], None] | None = None):
        self.cfg, self.t = cfg, cfg.train
        self.out = Path(self.t.out_dir)
        self.on_update = on_update
        self.overwrite = overwrite
        self.lock: RunLock | None = None  # rank 0's lock on the run directory
        self._abort_validation = False  # True while a validation may be cut short by a signal
        self.dist = runtime.dist_info()
        self.runlog = RunLog(None)  # silent until rank 0 opens the run directory
        self.log = self.runlog.log
        self.device = runtime.pick_device(self.t.device)
        if self.t.dtype == "auto":  # chosen per machine and model (runtime.auto_dtype); the saved config keeps "auto"
            self.t = replace(self.t, dtype=runtime.auto_dtype(self.device, d_model=cfg.model.d_model))
        runtime.check_dtype(self.t.dtype, self.device)
        runtime.set_threads(self.t.threads)
        self._owns_group = False
        if self.dist.enabled:
            self.device, self._owns_group = runtime.init_distributed(self.dist, self.device)
        try:
            self._setup(resume)
        except BaseException:
            self.close()
            raise

    def _setup(self, resume: bool) -> None:
        cfg, t = self.cfg, self.t
        runtime.on_main(lambda: self._open_run_dir(resume))
        runtime.seed_everything(t.seed)  # the same on every rank: identical initial parameters

        state, chosen = None, {}
        if resume:  # rank 0 picks the newest complete checkpoint; every rank loads that one

            def pick() -> str:
                path, chosen["state"] = newest_checkpoint(self.out, log=self.log)
                return str(path)

            self.resumed_from = Path(runtime.on_main(pick))
            state = chosen.get("state") or load_checkpoint(self.resumed_from, map_location="cpu")
        if state is not None:
            src_proto, tgt_proto = unpack_tokenizers(state)
        else:  # rank 0 trains or reads them; the others get the models, not a path they may not see
            src_proto, tgt_proto = runtime.on_main(lambda: tuple(tok.proto for tok in prepare_tokenizers(cfg, log=self.log)))
        self.src_tok, self.tgt_tok = Tokenizer(src_proto), Tokenizer(tgt_proto)
        self.model = Transformer(cfg.model, src_vocab_size=self.src_tok.vocab_size, tgt_vocab_size=self.tgt_tok.vocab_size).to(self.device)
        self.optimizer = build_optimizer(self.model, t)
        self.scheduler = build_scheduler(self.optimizer, t, d_model=cfg.model.d_model)
        self.scaler = torch.amp.GradScaler("cuda") if t.dtype == "float16" else None
        # rank 0 alone validates and saves, so it alone keeps the moving average (of the unwrapped model)
        self.ema = EMA(self.model, decay=t.ema_decay) if t.ema_decay > 0 and self.dist.is_main else None
        self.progress = Progress()
        if state is not None:
            self._restore(state)
        if self.dist.rank > 0:  # its own dropout masks; rank 0 keeps the single-process stream
            runtime.seed_everything(runtime.seed_for_rank(t.seed, self.dist.rank, self.progress.update))
        runtime.on_main(lambda: save_config(cfg, self.out / "config.yaml"))

        quiet = not sys.stderr.isatty() or not self.dist.is_main
        self.train_data, self.valid_data = runtime.main_first(lambda: load_corpora(cfg, self.src_tok, self.tgt_tok, quiet=quiet))
        self.log(f"training data: {self.train_data.summary.format()}")
        if self.train_data.num_pairs == 0:
            raise TrainError(f"{cfg.data.train_src}: no training pairs left after filtering; check the files and data.max_len")
        if cfg.model.restrict_output:  # a new model's kept set; a resumed one keeps its checkpoint's
            if cfg.data.subword_alpha > 0:  # sampled segmentations use pieces the best one never does (scored as UNK)
                raise ConfigError(
                    f"model.restrict_output keeps the pieces of the best segmentation of the training targets, but "
                    f"data.subword_alpha={cfg.data.subword_alpha:g} samples others; set one of them off"
                )
            if state is None:
                self.model.restrict_output_to(_target_pieces(self.train_data))
            self.log(f"output layer: {self.model.output_size:,} of {self.tgt_tok.vocab_size:,} target pieces (model.restrict_output)")
        if cfg.data.subword_alpha > 0:
            self.train_data = SampledSegmentation(
                self.train_data, self.src_tok, self.tgt_tok, alpha=cfg.data.subword_alpha, nbest=cfg.data.subword_nbest, seed=t.seed, max_len=cfg.data.max_len
            )
            self.log(f"subword regularisation: training pairs re-segmented every epoch (alpha {cfg.data.subword_alpha:g}, nbest {cfg.data.subword_nbest})")
        if self.valid_data is not None:
            self.log(f"validation data: {self.valid_data.summary.format()}")
            self.valid_data, dropped = checked_validation_set(self.valid_data, max_positions=cfg.model.max_positions, name=cfg.data.valid_src)
            if dropped:
                self.log(dropped)
        self._check_valid_beam()
        self._check_batching()
        # What the training forward runs: the loss module around the model (DDP wraps it); self.model is saved and validated.
        self.train_model: torch.nn.Module = TeacherForcedLoss(self.model, label_smoothing=t.label_smoothing)
        where = ""
        if self.dist.enabled:
            self.train_model = runtime.wrap_ddp(self.train_model, self.device)
            where = f"; {self.dist.world_size} processes ({torch.distributed.get_backend()}), {self.dist.world_size * t.update_freq} batches per update"
        self.log(f"model: {count_parameters(self.model):,} parameters; device {self.device}, dtype {t.dtype}, {torch.get_num_threads()} threads{where}")
        self.stop_requested: str | None = None

    # ------------------------------------------------------------ setup helpers
    def _open_run_dir(self, resume: bool) -> None:
        """Rank 0: create and lock the directory, refuse (or with --overwrite clear) a run already there, open the run log."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock(self.out)  # before anything is written; the holder's pid names a second process
        remove_stale_temporaries(self.out)
        removed = 0 if resume else start_new_run(self.out, overwrite=self.overwrite)
        self.runlog = RunLog(self.out, tensorboard=self.t.tensorboard)
        self.log = self.runlog.log
        if removed:
            self.log(f"--overwrite: removed the previous run's {removed} checkpoints from {self.out}")
        if not resume:
            self.runlog.drop_after(0)  # records of an earlier start that left no checkpoint (a new run's own come after)

    def _batching(self) -> str:
        """What the epoch batch lists depend on besides the epoch: the encoded training corpus (its cache
        key covers the files, the tokenizer and the length filters), max_tokens, seed and subword sampling."""
        d = self.cfg.data
        return (
            f"data={Path(self.train_data.summary.cache).name} max_tokens={self.t.max_tokens} seed={self.t.seed} subword={d.subword_alpha:g}/{d.subword_nbest}"
        )

    def _check_batching(self) -> None:
        """A resume continues at batch `batch_in_epoch` of its epoch's list; when the list itself changed (another
        corpus, max_tokens or seed) that position means other batches, so the epoch starts again, and the log says so."""
        p, now = self.progress, self._batching()
        if p.batching and p.batching != now and p.batch_in_epoch:
            was, changed = dict(kv.split("=", 1) for kv in p.batching.split()), dict(kv.split("=", 1) for kv in now.split())
            what = ", ".join(f"{k} {was.get(k)} -> {v}" for k, v in changed.items() if was.get(k) != v)
            self.log(
                f"resuming: the batching changed since the checkpoint ({what}): epoch {p.epoch} starts again from its first batch "
                f"(batch {p.batch_in_epoch} of the old list is another batch of the new one)"
            )
            p.batch_in_epoch = 0
        p.batching = now

    def _check_valid_beam(self) -> None:
        """The validation beam against the target vocabulary now, not at the first validation hours later."""
        t = self.t
        if self.valid_data is not None and t.valid_bleu_sentences >= 0 and t.valid_beam > max_beam(self.tgt_tok.vocab_size):
            raise ConfigError(
                f"train.valid_beam={t.valid_beam}: the target vocabulary has {self.tgt_tok.vocab_size} ids, enough for a beam "
                f"of at most {max_beam(self.tgt_tok.vocab_size)}; lower train.valid_beam (1 = greedy)"
            )

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        saved = config_from_checkpoint(state, source=str(self.resumed_from)).train
        changed = restore_optimizer(self.optimizer, state["optimizer"], model=self.model, saved_cfg=saved, train_cfg=self.t)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"], source=str(self.resumed_from))
        elif self.ema is not None:
            self.ema.reset()
            self.log(f"train.ema_decay={self.t.ema_decay:g}: {self.resumed_from} holds no EMA weights; the average starts from its weights")
        self.progress = Progress(**state["progress"])
        if self.dist.is_main:  # other ranks reseed (see the module docstring)
            set_rng_state(state["rng"])
        p = self.progress
        self.log(f"resumed from {self.resumed_from} at update {p.update}, epoch {p.epoch}")
        for change in changed:
            self.log(f"resuming with {change}: applied from update {p.update + 1} on (Adam's moment estimates are kept)")
        dropped = self.runlog.drop_after(p.update)
        if dropped:
            self.log(f"metrics.jsonl: {dropped} records after update {p.update} removed (written after that checkpoint; trained again now)")

    def close(self) -> None:
        """Close the run log and leave the process group this trainer created."""
        self.runlog.close()
        # Drop DDP first: were its reducer the last holder of the Gloo group, the group's destructor
        # would wait for Gloo's threads while holding the GIL they may need (a deadlock at exit).
        self.train_model = getattr(self, "model", None)
        if self._owns_group:
            runtime.shutdown_distributed()
            self._owns_group = False
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> TrainResult:
        # The handlers stay until the final validation and save are done: a signal there (a scheduler's
        # SIGTERM before its SIGKILL) cuts the validation short and the checkpoint is still written.
        previous = _install_signal_handlers(self._request_stop, verbose=self.dist.is_main)
        try:
            return self._train()
        finally:
            _restore_signal_handlers(previous)

    def _train(self) -> TrainResult:
        t, p, rank, world = self.t, self.progress, self.dist.rank, self.dist.world_size
        start = time.monotonic()
        elapsed = lambda: p.elapsed + (time.monotonic() - start)  # noqa: E731 - tiny closure over start
        self.scheduler.clock = elapsed  # wsd cools down over the end of max_time on this clock (host time, no device sync)
        self.runlog.start_progress(total=t.max_updates or None, initial=p.update)
        window = Window()
        reason = self._stop_reason(elapsed())  # a resumed run may already be at its limits: then it trains no further
        last_val: dict[str, float] = {}
        nonfinite = 0  # updates in a row skipped by the NaN guard
        try:
            for u in () if reason else update_schedule(self.train_data, t, world_size=world, epoch=p.epoch, start=p.batch_in_epoch):
                if isinstance(self.train_data, SampledSegmentation) and u.start == 0:
                    st = self.train_data.last_stats
                    self.log(
                        f"epoch {u.epoch}: sampled segmentation in {st['seconds']:.1f} s, pieces x{st['src_piece_ratio']:.3f} (source) "
                        f"x{st['tgt_piece_ratio']:.3f} (target) of the best segmentation"
                    )
                mine = u.share(rank, world)
                filler = None if mine else self.train_data.get_batch(u.batches[0])
                stats = self.update([self.train_data.get_batch(idx) for idx in mine], filler=filler, ntokens=target_tokens(self.train_data, u.batches))
                p.epoch, p.batch_in_epoch = u.epoch, u.start + len(u.batches)
                p.update += 1
                p.tokens += stats["ntokens"]
                p.flops += _update_flops(self.train_data, u.batches, self.cfg.model, vocab=self.model.output_size)
                p.update_seconds += stats["seconds"]
                nonfinite = nonfinite + 1 if self.scaler is None and not math.isfinite(stats["gnorm"]) else 0
                window.add(stats)
                self.runlog.advance()
                if self.on_update is not None:
                    self.on_update(p.update, stats)
                if p.update % t.log_every == 0:
                    self.runlog.train(update=p.update, epoch=p.epoch, wall=elapsed(), **window.flush())
                if self.valid_data is not None and p.update % t.validate_every == 0:
                    with window.paused():  # tokens/s in the log counts training time only
                        last_val = self._validate_everywhere(elapsed())
                    if t.patience and p.bad_validations >= t.patience:
                        reason = f"no improvement in {t.patience} validations (patience)"
                elif t.writes_numbered(p.update, validating=False):  # a numbered checkpoint between validations
                    wall = elapsed()
                    with window.paused():
                        runtime.on_main(lambda: self._save_numbered(last_val, wall))
                if nonfinite >= MAX_NONFINITE_UPDATES:  # the gradient norm is the same on every rank (after the all-reduce)
                    reason = (
                        f"diverged: the last {nonfinite} updates all had a non-finite gradient norm and were skipped (NaN guard); "
                        "the model is saved as it was before them; lower train.lr, raise train.warmup_updates or check the data"
                    )
                reason = reason or self._stop_reason(elapsed())
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
        diverged = nonfinite >= MAX_NONFINITE_UPDATES
        if reason != "interrupted" and not diverged and self.valid_data is not None and p.last_validated != p.update:
            last_val = self._validate_everywhere(elapsed())
            if not last_val:  # a signal cut the final validation short (on rank 0; the empty result reached every rank)
                reason = "interrupted"
        p.elapsed = elapsed()
        runtime.on_main(lambda: self._finish(reason, last_val))  # the others wait for the checkpoint
        if diverged:
            raise TrainError(f"{self.out}: {reason}")
        return TrainResult(self.out, p, reason, last_val)

    def _finish(self, reason: str, last_val: dict[str, float]) -> None:
        p = self.progress
        self._save([self.out / "checkpoint_last.pt"], last_val)
        peak, source = flops.peak_for(self.t.dtype, device=self.device, peak_tflops=self.t.peak_tflops)
        cost = flops.cost_summary(
            tokens=p.tokens,
            train_flops=p.flops,
            update_seconds=p.update_seconds,
            wall_seconds=p.elapsed,
            peak_flops_per_s=peak,
            peak_source=source,
            world_size=self.dist.world_size,
        )
        self.runlog.summary(update=p.update, epoch=p.epoch, wall=p.elapsed, stop_reason=reason, target_tokens=p.tokens, last_valid=last_val, cost=cost)
        self.log(flops.format_cost(cost, tokens=p.tokens, wall_seconds=p.elapsed))
        if reason == "interrupted":
            self.log(f"interrupted at update {p.update}: saved {self.out / 'checkpoint_last.pt'}; continue with `tmt train --resume {self.out}`")
        else:
            self.log(f"stopped at update {p.update} (epoch {p.epoch}): {reason}; checkpoints in {self.out}")

    def _request_stop(self) -> None:
        """The signal handler's action: stop after this update; inside a validation, stop validating now."""
        self.stop_requested = "interrupted"
        if self._abort_validation:
            self._abort_validation = False
            raise _ValidationInterrupted

    def _stop_reason(self, elapsed: float) -> str:
        """Why to stop after this update ("" = go on): a signal or a limit; the same on every rank."""
        t, reason = self.t, self.stop_requested or ""
        if not reason and t.max_updates and self.progress.update >= t.max_updates:
            reason = f"max_updates={t.max_updates} reached"
        elif not reason and t.max_time and elapsed >= t.max_time * 60:
            reason = f"max_time={t.max_time:g} minutes reached"
        if not self.dist.enabled:
            return reason
        # a signal may reach one rank only, and clocks differ: any rank's stop stops all
        interrupted, limited = runtime.all_reduce_sum([float(reason == "interrupted"), float(bool(reason))], self.device)
        if interrupted:
            return "interrupted"
        return (reason or f"max_time={self.t.max_time:g} minutes reached on another rank") if limited else ""

    def update(self, batches: list[Batch], *, filler: Batch | None = None, ntokens: int | None = None) -> dict:
        """One optimizer update over this rank's `batches` (gradient accumulation); returns the stats
        summed over all ranks. A rank given no batch (end of an epoch) runs `filler` with weight 0 so
        that it still joins the gradient all-reduce. `ntokens`: the target tokens of the whole update (all
        ranks), counted on the host from the batch lengths (`target_tokens`); None: summed across ranks here.

        Host syncs (each stalls a GPU; tests count them): one per update, the gradient norm, which the NaN
        guard needs on the host to decide whether Adam steps and the schedule advances (it does not on an
        overflow or NaN). Labels are selected by index (`Batch.labels`), and "loss" / "nll" stay on the
        device: float64 sums (the host's Python floats before), summed across ranks by one all-reduce that
        does not block the host under NCCL; the log reads them every `log_every` updates. An `on_update`
        hook gets them as floats, at the cost of one more sync per update.
        """
        self.train_model.train()
        world = self.dist.world_size
        if ntokens is None:
            ntokens = int(runtime.all_reduce_sum([sum(b.ntokens for b in batches)], self.device)[0])
        work = [(b, 1.0) for b in batches] or [(filler, 0.0)]
        sums = torch.zeros(2, dtype=runtime.accumulator_dtype(self.device), device=self.device)  # loss, nll of this rank
        tic = time.perf_counter()
        for i, (batch, weight) in enumerate(work):
            batch = batch.to(self.device, non_blocking=True)  # from pinned memory on CUDA: no wait
            # DDP all-reduces gradients in the backward of the update's last micro-batch only
            sync = i == len(work) - 1 or not self.dist.enabled
            with contextlib.nullcontext() if sync else self.train_model.no_sync():
                with runtime.autocast(self.device, self.t.dtype):  # projection and loss fused, only at label positions
                    loss, nll, _ = self.train_model(batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded)
                # per-token mean over the whole update; x world: DDP averages the ranks' gradients
                scaled = loss / ntokens * (weight * world)
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            if weight:
                sums += torch.stack([loss.detach(), nll]).to(sums.dtype)
        runtime.all_reduce_sum_(sums)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # records the overflow for scaler.update()
        # The norm always (the NaN guard reads it); the clipping pass over every gradient only when asked for
        # (clip_grad_norm_ with an infinite max_norm still multiplies every gradient by 1.0).
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        if self.t.clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(self.model.parameters(), self.t.clip_norm, norm)
        gnorm = float(norm)  # the update's one host sync
        lr = self.scheduler.lr  # the schedule already set it for this update
        stepped = math.isfinite(gnorm)  # non-finite: an fp16 overflow (the scaler lowers its scale) or a NaN
        if stepped:
            self.optimizer.step()  # gradients already unscaled: scaler.step would only read the overflow flag again
            if self.ema is not None:  # a skipped update (overflow, NaN) leaves the average alone too
                self.ema.update()
        elif self.scaler is None:
            self.log(f"update {self.progress.update + 1}: gradient norm is {gnorm}; update skipped (NaN guard)")
        if self.scaler is not None:
            self.scaler.update()
        if stepped:  # a skipped update leaves the learning-rate schedule where it was
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats = {"loss": sums[0], "nll": sums[1], "ntokens": ntokens, "lr": lr, "gnorm": gnorm, "seconds": time.perf_counter() - tic}
        if self.on_update is not None:
            stats["loss"], stats["nll"] = sums.tolist()
        return stats

    # ------------------------------------------------------------ validation and checkpoints
    def validate(self) -> dict[str, float]:
        """Validation loss/perplexity over the whole validation set and BLEU on its first sentences (evaluate.py),
        of the EMA weights when train.ema_decay > 0 (so checkpoint_best.pt is chosen on what decoding uses)."""
        assert self.valid_data is not None
        with self.ema.applied() if self.ema is not None else contextlib.nullcontext():
            return self._validate()

    def _validate(self) -> dict[str, float]:
        t = self.t
        result = validation_loss(
            self.model, self.valid_data, max_tokens=t.max_tokens, seed=t.seed, label_smoothing=t.label_smoothing, device=self.device, dtype=t.dtype
        )
        if t.valid_bleu_sentences >= 0:
            result["val_bleu"] = validation_bleu(
                self.model, self._bleu_set, self.tgt_tok, beam=t.valid_beam, decode=self.cfg.decode, device=self.device, dtype=t.dtype
            )
        return result

    @functools.cached_property
    def _bleu_set(self) -> BleuSet:
        """The validation pairs of BLEU, read and encoded once per run; sources longer than the model takes are
        truncated, as `tmt translate` does, and counted in the log."""
        limit = self.cfg.model.max_positions - 1  # + EOS
        pairs = bleu_set(self.cfg.data.valid_src, self.cfg.data.valid_tgt, self.src_tok, limit=self.t.valid_bleu_sentences, max_src_tokens=limit)
        if pairs.truncated:
            self.log(f"validation BLEU: {pairs.truncated} of {len(pairs.src_ids)} sources longer than {limit} pieces truncated")
        return pairs

    def _validate_everywhere(self, wall: float) -> dict[str, float]:
        """Validate and save on rank 0; every rank gets the results and the patience bookkeeping."""
        p = self.progress

        def on_rank0() -> tuple:
            val = self._validate_and_save(wall)
            return val, p.best, p.bad_validations, p.last_validated

        val, p.best, p.bad_validations, p.last_validated = runtime.on_main(on_rank0)
        return val

    def _validate_and_save(self, wall: float) -> dict[str, float]:
        """Validate, then save best (when improved), numbered (when due) and last, in that order; {} when a
        signal cut the validation short (nothing saved here: the run stops and saves checkpoint_last.pt)."""
        p, t = self.progress, self.t
        tic = time.perf_counter()
        try:
            self._abort_validation = not self.stop_requested
            if self.stop_requested:
                raise _ValidationInterrupted
            val = self.validate()
        except _ValidationInterrupted:
            self.log(f"validation at update {p.update} cut short by the signal; saving without it")
            return {}
        finally:
            self._abort_validation = False
        p.last_validated = p.update
        metric = val.get("val_bleu") if t.best_metric == "bleu" and "val_bleu" in val else val["val_loss"]
        higher_better = t.best_metric == "bleu" and "val_bleu" in val
        improved = p.best is None or (metric > p.best if higher_better else metric < p.best)
        if improved:
            p.best, p.bad_validations = metric, 0
        else:
            p.bad_validations += 1
        self.runlog.valid(update=p.update, epoch=p.epoch, wall=wall, val=val, best=improved, seconds=time.perf_counter() - tic)
        # best before last: a kill between the two must not leave an older model as best for good (the
        # progress in last already counts this validation as the best)
        numbered = t.writes_numbered(p.update, validating=True)
        self._save(
            [self.out / "checkpoint_best.pt"] * improved + [numbered_checkpoint_path(self.out, p.update)] * numbered + [self.out / "checkpoint_last.pt"],
            val,
            elapsed=wall,
        )
        if numbered:
            prune_checkpoints(self.out, t.keep_last, keep_every=t.keep_every)
        return val

    def _save_numbered(self, val: dict[str, float], wall: float) -> None:
        """checkpoint_<update>.pt and checkpoint_last.pt (every save is resumable: --resume takes the newest)."""
        self._save([numbered_checkpoint_path(self.out, self.progress.update), self.out / "checkpoint_last.pt"], val, elapsed=wall)
        prune_checkpoints(self.out, self.t.keep_last, keep_every=self.t.keep_every)

    def _save(self, paths: list[Path], val: dict[str, float], *, elapsed: float | None = None) -> None:
        """The training state, serialised once, under each of `paths` in order: written atomically to the first,
        copied atomically to the others, so that each name is complete whenever it exists."""
        p = self.progress
        progress = asdict(p)
        if elapsed is not None:
            progress["elapsed"] = elapsed
        state = {
            "model": self.model.state_dict(),
            "config": to_dict(self.cfg),
            "tokenizers": pack_tokenizers(self.src_tok.proto, self.tgt_tok.proto),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng_state(),
            "progress": progress,
            "metrics": dict(val),
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        first = save_checkpoint(state, paths[0])
        for path in paths[1:]:
            copy_checkpoint(first, path)


# ---------------------------------------------------------------- small helpers
def target_tokens(data, batches: list) -> int:  # noqa: ANN001 - ParallelData or SampledSegmentation
    """Target tokens (pieces + EOS) of the pairs in `batches` (index arrays), from the lengths on the host:
    every rank knows the whole update's count without an all-reduce (it equals the sum of `Batch.ntokens`)."""
    return sum(int(data.tgt_lengths[idx].sum()) + len(idx) for idx in batches)


def _target_pieces(data) -> torch.Tensor:  # noqa: ANN001 - ParallelData
    """Every target id of the training pairs (repeats kept): the pieces model.restrict_output keeps (model.restrict_output_to)."""
    return torch.cat([torch.from_numpy(data.pair(i)[1].astype("int64")) for i in range(data.num_pairs)])


def _update_flops(data, batches: list, m, *, vocab: int) -> int:  # noqa: ANN001 - ParallelData or SampledSegmentation
    """Training FLOPs of the whole update (all ranks), counted as the benchmark counts them (padded batches,
    flops.train_flops), from the lengths on the host: padded source = longest + EOS, target = longest + BOS."""
    return sum(
        flops.train_flops(m, vocab=vocab, batch=len(idx), src_len=int(data.src_lengths[idx].max()) + 1, tgt_len=int(data.tgt_lengths[idx].max()) + 1)
        for idx in batches
    )


def _install_signal_handlers(request_stop: Callable[[], None], *, verbose: bool = True) -> dict:
    """First SIGINT/SIGTERM: finish the current update, save, exit. A second SIGINT aborts at once
    (checkpoints are written atomically, so the last one stays intact). `verbose`: say so on stderr."""
    previous = {}

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if verbose:
            echo(f"\n{signal.Signals(signum).name} received: finishing this update and saving a checkpoint (Ctrl-C again to abort)")
        request_stop()  # last: inside a validation it raises to cut the validation short

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread (e.g. some test runners): no handlers
        pass
    return previous


def _restore_signal_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
