"""`tmt train`: the teacher-forced training loop, validation, checkpoints and exact resume.

One update = `update_freq` token-budget batches whose gradients are summed, normalised by the
update's target-token count, clipped, and applied by Adam under the warm-up schedule.
Everything needed to continue exactly (weights, optimizer, scheduler, scaler, RNG states,
epoch and position in the epoch) goes into `checkpoint_last.pt`, written atomically.

Data parallel. Launched by torchrun with WORLD_SIZE > 1, each process joins the job (NCCL on
GPUs, one GPU per process; Gloo on CPU) and trains a DistributedDataParallel replica:
- Batches. Every rank computes the same epoch batch list (a function of seed and epoch); an
  update consumes the next world_size x update_freq batches of it, rank r taking those at
  positions r, r + world_size, ... So an update sees exactly the batches of one process with
  update_freq x world_size, and `Progress.batch_in_epoch` counts these global batches: a
  checkpoint saved under one world size resumes under any other.
- Epoch remainder. When the last window of an epoch holds fewer batches than ranks, a rank
  left without one runs the window's first batch with weight 0, so that it takes part in the
  gradient all-reduce; no batch is dropped or repeated.
- Loss. The update's target tokens are summed over ranks and each rank's loss is divided by
  that sum, times world_size because DDP averages gradients: the gradient is that of one
  process on the whole global batch. Only the last micro-batch of an update all-reduces.
- Rank 0 alone trains the tokenizer (the others receive it), writes train.log, metrics.jsonl,
  config.yaml and checkpoints, and validates; results and patience are shared with all ranks.
  It encodes the corpus cache first, the others then read it. Other ranks print only errors.
- Stopping. A SIGINT/SIGTERM on any rank, or max_time on any rank's clock, is summed across
  ranks once per update: all ranks stop after the same update and rank 0 saves.
- RNG on resume: rank 0 restores the checkpoint's generator states; rank r > 0 reseeds with
  runtime.seed_for_rank(seed, r, update), as at the start of a run (update 0). Batch order
  never depends on these generators, only dropout does, so a resumed multi-process run with
  dropout differs from an uninterrupted one in the dropout masks of ranks > 0 only.
"""

from __future__ import annotations

from transformer_mt.errors import TmtError

import contextlib
import functools
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from transformer_mt import runtime
from transformer_mt.checkpoint import (
    load_checkpoint,
    numbered_checkpoint_path,
    pack_tokenizers,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unpack_tokenizers,
    config_from_checkpoint,
)
from transformer_mt.config import Config, ConfigError, load_config, save_config, to_dict
from transformer_mt.data import Batch, SampledSegmentation
from transformer_mt.loss import TeacherForcedLoss, label_smoothed_nll_loss
from transformer_mt.metrics import read_lines, score
from transformer_mt.model import Transformer, count_parameters
from transformer_mt.optim import build_optimizer, build_scheduler
from transformer_mt.prepare import load_corpora, prepare_tokenizers
from transformer_mt.tokenizer import PAD_ID, Tokenizer
from transformer_mt.translate import translate_ids


class TrainError(TmtError, RuntimeError):
    """A training problem worded for the user."""


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


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports."""

    out_dir: Path
    progress: Progress
    stop_reason: str
    last_validation: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- entry points
def train_from_cli(*, config: Path | None, overrides: list[str], resume: Path | None) -> TrainResult:
    """Build the config (from --config, or from the run being resumed) and train; exits 130 when interrupted."""
    if resume is not None:
        cfg = resumed_config(resume, overrides)
        if config is not None and runtime.dist_info().is_main:
            print(f"tmt train: resuming {resume}: its saved config is used, --config {config} is ignored (use --set to change values)", file=sys.stderr)
    else:
        if config is None:
            raise ConfigError("tmt train needs --config FILE (see configs/) or --resume RUN_DIR")
        cfg = load_config(config, overrides)
    result = train(cfg, resume=resume is not None)
    if result.stop_reason == "interrupted":
        sys.exit(130)
    return result


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in RUN_DIR/checkpoint_last.pt, with --set overrides that do not change the architecture."""
    path = Path(run_dir) / "checkpoint_last.pt"
    if not path.is_file():
        raise TrainError(f"{path}: no checkpoint to resume from; check the run directory given to --resume")
    saved = config_from_checkpoint(load_checkpoint(path), source=str(path))
    cfg = load_config(None, [f"{s}.{k}={json.dumps(v)}" for s, sec in to_dict(saved).items() for k, v in sec.items()] + list(overrides), check_files=False)
    if cfg.model != saved.model or cfg.tokenizer != saved.tokenizer:
        raise ConfigError(f"--resume {run_dir}: model.* and tokenizer.* cannot change when resuming; start a new run in another train.out_dir")
    cfg.train.out_dir = str(run_dir)
    return cfg


def train(cfg: Config, *, resume: bool = False, on_update: Callable[[int, dict], None] | None = None) -> TrainResult:
    """Train according to `cfg`; with `resume`, continue from cfg.train.out_dir/checkpoint_last.pt.
    Under torchrun (WORLD_SIZE > 1) this process is one rank of a data-parallel run."""
    return Trainer(cfg, resume=resume, on_update=on_update).run()


# ---------------------------------------------------------------- the trainer
class Trainer:
    """Holds the model, optimizer and data of one run; `run()` is the loop."""

    def __init__(self, cfg: Config, *, resume: bool, on_update: Callable[[int, dict], None] | None = None):
        self.cfg, self.t = cfg, cfg.train
        self.out = Path(self.t.out_dir)
        self.on_update = on_update
        self.dist = runtime.dist_info()
        self.log_file = self.metrics_file = None  # opened on rank 0 only
        self.device = runtime.pick_device(self.t.device)
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

        state = load_checkpoint(self.out / "checkpoint_last.pt", map_location="cpu") if resume else None
        if state is not None:
            src_proto, tgt_proto = unpack_tokenizers(state)
        else:  # rank 0 trains or reads them; the others get the models, not a path they may not see
            src_proto, tgt_proto = runtime.on_main(lambda: tuple(tok.proto for tok in prepare_tokenizers(cfg, log=self.log)))
        self.src_tok, self.tgt_tok = Tokenizer(src_proto), Tokenizer(tgt_proto)
        self.model = Transformer(cfg.model, src_vocab_size=self.src_tok.vocab_size, tgt_vocab_size=self.tgt_tok.vocab_size).to(self.device)
        self.optimizer = build_optimizer(self.model, t)
        self.scheduler = build_scheduler(self.optimizer, t, d_model=cfg.model.d_model)
        self.scaler = torch.amp.GradScaler("cuda") if t.dtype == "float16" else None
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
        if cfg.data.subword_alpha > 0:
            self.train_data = SampledSegmentation(self.train_data, self.src_tok, self.tgt_tok, alpha=cfg.data.subword_alpha,
                                                  nbest=cfg.data.subword_nbest, seed=t.seed, max_len=cfg.data.max_len)
            self.log(f"subword regularisation: training pairs re-segmented every epoch (alpha {cfg.data.subword_alpha:g}, nbest {cfg.data.subword_nbest})")
        if self.valid_data is not None:
            self.log(f"validation data: {self.valid_data.summary.format()}")
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
        """Rank 0: refuse to overwrite a run, create the directory, open the log and metrics files."""
        if not resume and (self.out / "checkpoint_last.pt").exists():
            raise TrainError(f"{self.out} already holds a run (checkpoint_last.pt); continue it with `tmt train --resume {self.out}` or set train.out_dir to a new directory")
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.out / "train.log", "a", encoding="utf-8")
        self.metrics_file = open(self.out / "metrics.jsonl", "a", encoding="utf-8")

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        if self.dist.is_main:  # other ranks reseed (see the module docstring)
            set_rng_state(state["rng"])
        self.log(f"resumed from {self.out / 'checkpoint_last.pt'} at update {self.progress.update}, epoch {self.progress.epoch}")

    def close(self) -> None:
        """Close the log files and leave the process group this trainer created."""
        for handle in (self.log_file, self.metrics_file):
            if handle is not None:
                handle.close()
        self.log_file = self.metrics_file = None
        # Drop DDP first: were its reducer the last holder of the Gloo group, the group's destructor
        # would wait for Gloo's threads while holding the GIL they may need (a deadlock at exit).
        self.train_model = getattr(self, "model", None)
        if self._owns_group:
            runtime.shutdown_distributed()
            self._owns_group = False

    # ------------------------------------------------------------ logging
    def log(self, msg: str) -> None:
        if self.log_file is None:  # ranks other than 0 stay silent
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.log_file.write(f"{stamp} {msg}\n")
        self.log_file.flush()
        _tqdm_write(msg)

    def metric(self, record: dict[str, Any]) -> None:
        if self.metrics_file is None:
            return
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()

    # ------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> TrainResult:
        t, p, rank, world = self.t, self.progress, self.dist.rank, self.dist.world_size
        start = time.monotonic()
        elapsed = lambda: p.elapsed + (time.monotonic() - start)  # noqa: E731 - tiny closure over start
        previous = _install_signal_handlers(self._request_stop, verbose=self.dist.is_main)
        bar = _progress_bar(total=t.max_updates or None, initial=p.update, enabled=self.dist.is_main)
        window = _Window()
        reason = ""
        last_val: dict[str, float] = {}
        try:
            while not reason:
                batches = self.train_data.batches(p.epoch, max_tokens=t.max_tokens, seed=t.seed)
                if isinstance(self.train_data, SampledSegmentation) and p.batch_in_epoch == 0:
                    st = self.train_data.last_stats
                    self.log(f"epoch {p.epoch}: sampled segmentation in {st['seconds']:.1f} s, pieces x{st['src_piece_ratio']:.3f} (source) "
                             f"x{st['tgt_piece_ratio']:.3f} (target) of the best segmentation")
                while p.batch_in_epoch < len(batches) and not reason:
                    group = batches[p.batch_in_epoch:p.batch_in_epoch + world * t.update_freq]  # global batches of this update
                    mine = group[rank::world]
                    filler = None if mine else self.train_data.get_batch(group[0])
                    stats = self._update([self.train_data.get_batch(idx) for idx in mine], filler=filler)
                    p.batch_in_epoch += len(group)
                    p.update += 1
                    window.add(stats)
                    bar.update(1)
                    if self.on_update is not None:
                        self.on_update(p.update, stats)
                    if p.update % t.log_every == 0:
                        self._log_window(window, bar, elapsed())
                    if self.valid_data is not None and p.update % t.validate_every == 0:
                        last_val = self._validate_everywhere(elapsed())
                        if t.patience and p.bad_validations >= t.patience:
                            reason = f"no improvement in {t.patience} validations (patience)"
                    elif t.save_every and p.update % t.save_every == 0:  # a numbered checkpoint between validations
                        wall = elapsed()
                        runtime.on_main(lambda: self._save_numbered(last_val, wall))
                    reason = reason or self._stop_reason(elapsed())
                if p.batch_in_epoch >= len(batches):
                    p.epoch, p.batch_in_epoch = p.epoch + 1, 0
                    if t.max_epochs and p.epoch > t.max_epochs:
                        reason = reason or f"max_epochs={t.max_epochs} reached"
        finally:
            bar.close()
            _restore_signal_handlers(previous)
        if reason != "interrupted" and self.valid_data is not None and p.last_validated != p.update:
            last_val = self._validate_everywhere(elapsed())
        p.elapsed = elapsed()
        runtime.on_main(lambda: self._finish(reason, last_val))  # the others wait for the checkpoint
        return TrainResult(self.out, p, reason, last_val)

    def _finish(self, reason: str, last_val: dict[str, float]) -> None:
        p = self.progress
        self._save(self.out / "checkpoint_last.pt", last_val)
        if reason == "interrupted":
            self.log(f"interrupted at update {p.update}: saved {self.out / 'checkpoint_last.pt'}; continue with `tmt train --resume {self.out}`")
        else:
            self.log(f"stopped at update {p.update} (epoch {p.epoch}): {reason}; checkpoints in {self.out}")

    def _request_stop(self) -> None:
        self.stop_requested = "interrupted"

    def _stop_reason(self, elapsed: float) -> str:
        """Why to stop after this update ("" = go on): a signal or a limit; the same on every rank."""
        reason = self.stop_requested or _limit_reached(self.t, self.progress, elapsed)
        if not self.dist.enabled:
            return reason
        # a signal may reach one rank only, and clocks differ: any rank's stop stops all
        interrupted, limited = runtime.all_reduce_sum([float(reason == "interrupted"), float(bool(reason))], self.device)
        if interrupted:
            return "interrupted"
        return (reason or f"max_time={self.t.max_time:g} minutes reached on another rank") if limited else ""

    def _update(self, batches: list[Batch], *, filler: Batch | None = None) -> dict[str, float]:
        """One optimizer update over this rank's `batches` (gradient accumulation); returns the stats
        summed over all ranks. A rank given no batch (end of an epoch) runs `filler` with weight 0 so
        that it still joins the gradient all-reduce."""
        self.train_model.train()
        world = self.dist.world_size
        local_tokens = sum(b.ntokens for b in batches)
        total_tokens = int(runtime.all_reduce_sum([local_tokens], self.device)[0])  # the whole update's
        work = [(b, 1.0) for b in batches] or [(filler, 0.0)]
        loss_sum = nll_sum = 0.0
        tic = time.perf_counter()
        for i, (batch, weight) in enumerate(work):
            batch = batch.to(self.device)
            # DDP all-reduces gradients in the backward of the update's last micro-batch only
            sync = i == len(work) - 1 or not self.dist.enabled
            with contextlib.nullcontext() if sync else self.train_model.no_sync():
                with runtime.autocast(self.device, self.t.dtype):  # projection and loss fused, only at label positions
                    loss, nll, _ = self.train_model(batch.src, batch.tgt_in, batch.tgt_out)
                # per-token mean over the whole update; x world: DDP averages the ranks' gradients
                scaled = loss / total_tokens * (weight * world)
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            if weight:
                loss_sum += loss.item()
                nll_sum += nll.item()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.t.clip_norm if self.t.clip_norm > 0 else float("inf")
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self.scheduler.lr  # the schedule already set it for this update
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step itself when gradients overflowed
            self.scaler.update()
        elif math.isfinite(gnorm):
            self.optimizer.step()
        else:
            self.log(f"update {self.progress.update + 1}: gradient norm is {gnorm}; update skipped (NaN guard)")
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, nll_sum = runtime.all_reduce_sum([loss_sum, nll_sum], self.device)
        return {"loss": loss_sum, "nll": nll_sum, "ntokens": total_tokens, "lr": lr, "gnorm": gnorm,
                "seconds": time.perf_counter() - tic}

    def _log_window(self, window: "_Window", bar, wall: float) -> None:
        rec = window.flush()
        rec.update(update=self.progress.update, epoch=self.progress.epoch, wall=round(wall, 2))
        self.metric(rec)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{rec['lr']:.2e}", tok_s=f"{rec['tokens_per_s']:.0f}")
        if bar.disable:
            self.log(f"update {rec['update']} epoch {rec['epoch']}: loss {rec['loss']:.3f} ppl {rec['ppl']:.2f} lr {rec['lr']:.3e} {rec['tokens_per_s']:.0f} tgt tok/s")

    # ------------------------------------------------------------ validation and checkpoints
    def validate(self) -> dict[str, float]:
        """Validation loss/perplexity over the whole validation set and BLEU on its first sentences."""
        assert self.valid_data is not None
        self.model.eval()
        loss_sum = nll_sum = 0.0
        ntokens = 0
        with torch.inference_mode(), runtime.autocast(self.device, self.t.dtype):
            for idx in self.valid_data.batches(0, max_tokens=self.t.max_tokens, seed=self.t.seed):
                batch = self.valid_data.get_batch(idx).to(self.device)
                loss, nll, n = label_smoothed_nll_loss(self.model(batch.src, batch.tgt_in), batch.tgt_out, epsilon=self.t.label_smoothing)
                loss_sum, nll_sum, ntokens = loss_sum + loss.item(), nll_sum + nll.item(), ntokens + int(n)
        result = {"val_loss": loss_sum / ntokens, "val_nll": nll_sum / ntokens, "val_ppl": math.exp(min(nll_sum / ntokens, 100.0))}
        if self.t.valid_bleu_sentences >= 0:
            result.update(self._valid_bleu())
        return result

    @functools.cached_property
    def _bleu_set(self) -> tuple[list[list[int]], list[str]]:
        """Encoded sources and raw references for validation BLEU: read and encoded once per run."""
        srcs, refs = _valid_pairs(self.cfg.data.valid_src, self.cfg.data.valid_tgt, self.t.valid_bleu_sentences)
        return self.src_tok.encode(srcs), refs

    def _valid_bleu(self) -> dict[str, float]:
        src_ids, refs = self._bleu_set
        d = self.cfg.decode
        hyps = translate_ids(self.model, src_ids, beam=self.t.valid_beam, lenpen=d.lenpen,
                             max_len_a=d.max_len_a, max_len_b=d.max_len_b, batch_tokens=d.batch_tokens,
                             device=self.device, dtype=self.t.dtype)
        text = self.tgt_tok.decode([h[0].tokens for h in hyps])
        return {"val_bleu": score(text, [refs], metrics=("bleu",))["bleu"]["score"]}

    def _validate_everywhere(self, wall: float) -> dict[str, float]:
        """Validate and save on rank 0; every rank gets the results and the patience bookkeeping."""
        p = self.progress

        def on_rank0() -> tuple:
            val = self._validate_and_save(wall)
            return val, p.best, p.bad_validations, p.last_validated

        val, p.best, p.bad_validations, p.last_validated = runtime.on_main(on_rank0)
        return val

    def _validate_and_save(self, wall: float) -> dict[str, float]:
        p, t = self.progress, self.t
        tic = time.perf_counter()
        val = self.validate()
        p.last_validated = p.update
        metric = val.get("val_bleu") if t.best_metric == "bleu" and "val_bleu" in val else val["val_loss"]
        higher_better = t.best_metric == "bleu" and "val_bleu" in val
        improved = p.best is None or (metric > p.best if higher_better else metric < p.best)
        if improved:
            p.best, p.bad_validations = metric, 0
        else:
            p.bad_validations += 1
        self.metric({"update": p.update, "epoch": p.epoch, **{k: round(v, 4) for k, v in val.items()}, "wall": round(wall, 2), "valid_seconds": round(time.perf_counter() - tic, 2)})
        shown = ", ".join(f"{k[4:]} {v:.2f}" for k, v in val.items())
        self.log(f"validation at update {p.update}: {shown}{' (best)' if improved else ''}")
        self._save(self.out / "checkpoint_last.pt", val, elapsed=wall)
        if improved:
            self._save(self.out / "checkpoint_best.pt", val, elapsed=wall)
        if t.save_every == 0 or p.update % t.save_every == 0:
            self._save_numbered(val, wall)
        return val

    def _save_numbered(self, val: dict[str, float], wall: float) -> None:
        self._save(numbered_checkpoint_path(self.out, self.progress.update), val, elapsed=wall)
        prune_checkpoints(self.out, self.t.keep_last)

    def _save(self, path: Path, val: dict[str, float], *, elapsed: float | None = None) -> None:
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
        save_checkpoint(state, path)


# ---------------------------------------------------------------- small helpers
class _Window:
    """Sums training stats between two log lines."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = self.tokens = self.seconds = 0.0
        self.updates = 0
        self.lr = self.gnorm = 0.0
        self.tic = time.perf_counter()

    def add(self, s: dict[str, float]) -> None:
        self.loss += s["loss"]
        self.nll += s["nll"]
        self.tokens += s["ntokens"]
        self.updates += 1
        self.lr, self.gnorm = s["lr"], s["gnorm"]

    def flush(self) -> dict[str, float]:
        seconds = time.perf_counter() - self.tic
        tokens = max(self.tokens, 1.0)
        rec = {"loss": self.loss / tokens, "nll": self.nll / tokens, "ppl": math.exp(min(self.nll / tokens, 100.0)),
               "lr": self.lr, "gnorm": round(self.gnorm, 4), "tokens_per_s": self.tokens / max(seconds, 1e-9),
               "updates_per_s": self.updates / max(seconds, 1e-9)}
        self.reset()
        return rec


def _limit_reached(t, p: Progress, elapsed: float) -> str:
    if t.max_updates and p.update >= t.max_updates:
        return f"max_updates={t.max_updates} reached"
    if t.max_time and elapsed >= t.max_time * 60:
        return f"max_time={t.max_time:g} minutes reached"
    return ""


def _valid_pairs(src_path: str, tgt_path: str, limit: int) -> tuple[list[str], list[str]]:
    """The first `limit` (0 = all) validation pairs with text on both sides, as raw strings."""
    pairs = [(s, r) for s, r in zip(read_lines(src_path), read_lines(tgt_path)) if s.strip() and r.strip()]
    if limit > 0:
        pairs = pairs[:limit]
    return [s for s, _ in pairs], [r for _, r in pairs]


def _install_signal_handlers(request_stop: Callable[[], None], *, verbose: bool = True) -> dict:
    """First SIGINT/SIGTERM: finish the current update, save, exit. A second SIGINT aborts at once
    (checkpoints are written atomically, so the last one stays intact). `verbose`: say so on stderr."""
    previous = {}

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if verbose:
            _tqdm_write(f"\n{signal.Signals(signum).name} received: finishing this update and saving a checkpoint (Ctrl-C again to abort)")

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread (e.g. some test runners): no handlers
        pass
    return previous


def _restore_signal_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _progress_bar(*, total: int | None, initial: int, enabled: bool = True):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="upd", dynamic_ncols=True, disable=not (enabled and sys.stderr.isatty()), leave=False)


def _tqdm_write(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)
