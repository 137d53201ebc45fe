"""Setting up a run for the training loop: the config (new or resumed), the run directory, the tokenizers,
the train state, the data, and the checks that must fail before training rather than hours into it.

Each step is one function that `Trainer.__init__` calls in order; the order is part of the behaviour: the
generators are seeded before the model is built (identical initial parameters on every rank, and the same
stream a resumed run restores), and a resume's state is restored before the data is read.

Data parallel (torchrun, WORLD_SIZE > 1): each process joins the job (NCCL on GPUs, one GPU per process; Gloo
on CPU). Rank 0 alone trains the tokenizer (the others receive the model, not a path they may not see) and
encodes the corpus cache first, the others then read it. RNG on resume: rank 0 restores the checkpoint's
generator states; rank r > 0 reseeds with runtime.seed_for_rank(seed, r, update), as at the start of a run
(update 0). Batch order never depends on these generators, only dropout does, so a resumed multi-process run
with dropout differs from an uninterrupted one in the dropout masks of ranks > 0 only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.checkpoint import (
    config_from_checkpoint,
    load_checkpoint,
    model_weights,
    pack_tokenizer_pair,
    tokenizers_from_checkpoint,
)
from transformer_mt.config import (
    Config,
    ConfigError,
    TrainConfig,
    beam_problem,
    load_config,
    max_beam,
    stated_keys,
    to_dict,
    validate,
)
from transformer_mt.data import ParallelData, SampledSegmentation, load_corpora, prepare_tokenizers
from transformer_mt.decoding.rebuild import check_fit
from transformer_mt.errors import TmtError
from transformer_mt.evaluation import checked_validation_set
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.text import Tokenizer
from transformer_mt.training.ema import EMA
from transformer_mt.training.optim import build_optimizer, build_scheduler
from transformer_mt.training.policy import newest_checkpoint
from transformer_mt.training.rundir import RunLock, check_new_run, remove_old_run, remove_stale_temporaries
from transformer_mt.training.runlog import RunLog
from transformer_mt.training.state import Batching, Progress, TrainState
from transformer_mt.training.step import Corpus

Log = Callable[[str], None]


class TrainError(TmtError, RuntimeError):
    """A training problem worded for the user."""


# ---------------------------------------------------------------- the config
def train_config_from_cli(
    *, config: Path | None, overrides: list[str], resume: Path | None, overwrite: bool, init_from: Path | None = None
) -> Config:
    """The config of `tmt train`: from --config (with --init-from, the checkpoint's architecture and tokenizer),
    or from the run being resumed (--resume)."""
    if resume is not None and overwrite:
        raise ConfigError(f"--overwrite starts a new run, --resume {resume} continues one; give one of them")
    if resume is not None and init_from is not None:
        raise ConfigError(
            f"--init-from starts a new run from a checkpoint's weights, --resume {resume} continues one; give one of them"
        )
    if resume is None:
        if config is None:
            raise ConfigError("tmt train needs --config FILE (see configs/) or --resume RUN_DIR")
        overrides = list(overrides) + (
            [f"train.init_from={json.dumps(str(init_from))}"] if init_from is not None else []
        )
        cfg = load_config(config, overrides)
        return initialized_config(cfg, stated_keys(config, overrides)) if cfg.train.init_from else cfg
    if config is not None and runtime.dist_info().is_main:
        print(
            f"tmt train: resuming {resume}: its saved config is used, --config {config} is ignored (use --set to change values)",
            file=sys.stderr,
        )
    return resumed_config(resume, overrides)


# Model keys a fine-tuning run may set for itself: regularisation, not architecture.
FINE_TUNING_KEYS = ("model.dropout", "model.attention_dropout", "model.activation_dropout")


def initialized_config(cfg: Config, stated: dict[str, str]) -> Config:
    """``cfg`` with ``train.init_from``'s model and tokenizer sections: the weights fit only the architecture and
    vocabulary they were trained with. A key the config states (``stated``: key -> file or --set) that contradicts
    the checkpoint is refused, naming both, except the dropout rates (:data:`FINE_TUNING_KEYS`), which stay the config's."""
    path = cfg.train.init_from
    saved = config_from_checkpoint(load_checkpoint(path), source=path)
    for section in ("model", "tokenizer"):
        mine, theirs = to_dict(cfg)[section], to_dict(saved)[section]
        for key, value in theirs.items():
            dotted = f"{section}.{key}"
            if dotted in stated and dotted in FINE_TUNING_KEYS:
                continue
            if dotted in stated and mine[key] != value:
                raise ConfigError(
                    f"{stated[dotted]}: {dotted}={mine[key]!r} contradicts --init-from {path}, whose {dotted} is {value!r}; "
                    f"remove it (the architecture and tokenizer come from the checkpoint; only {', '.join(FINE_TUNING_KEYS)} may change)"
                )
            setattr(getattr(cfg, section), key, getattr(getattr(saved, section), key))
    validate(cfg, source=f"--init-from {path}", check_files=False)
    return cfg


def resumed_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config saved in the run's newest checkpoint (policy.newest_checkpoint), with --set overrides
    that do not change the architecture."""
    path, state = newest_checkpoint(run_dir)
    saved = config_from_checkpoint(state, source=str(path))
    cfg = load_config(
        None,
        [f"{s}.{k}={json.dumps(v)}" for s, sec in to_dict(saved).items() for k, v in sec.items()] + list(overrides),
        check_files=False,
    )
    if cfg.model != saved.model or cfg.tokenizer != saved.tokenizer:
        raise ConfigError(
            f"--resume {run_dir}: model.* and tokenizer.* cannot change when resuming; start a new run in another train.out_dir"
        )
    cfg.train.out_dir = str(run_dir)
    return cfg


# ---------------------------------------------------------------- the process, the run directory and the resume point
def process(cfg: Config, dist: runtime.DistInfo) -> tuple[TrainConfig, torch.device, bool]:
    """This process's device, dtype and threads, and its place in a data-parallel job. Returns the train config
    it trains with (train.dtype "auto" resolved; the saved config keeps "auto"), the device, and whether it
    created the process group (and must leave it)."""
    t, device = cfg.train, runtime.pick_device(cfg.train.device)
    if t.dtype == "auto":  # chosen per machine and model (runtime.auto_dtype)
        t = replace(t, dtype=runtime.auto_dtype(device, d_model=cfg.model.d_model))
    runtime.check_dtype(t.dtype, device)
    runtime.set_threads(t.threads)
    runtime.reuse_freed_memory()  # every update allocates the same activations again
    if not dist.enabled:
        return t, device, False
    device, owns_group = runtime.init_distributed(dist, device)
    return t, device, owns_group


def open_run_dir(out: Path, t: TrainConfig, *, resume: bool, overwrite: bool) -> tuple[RunLock, RunLog, list[Path]]:
    """Rank 0: create and lock the directory, refuse a run already there unless `overwrite`, open the run log;
    returns the old run's checkpoints, which :func:`start_over` removes after every check of the new run."""
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)  # before anything is written; the holder's pid names a second process
    runlog: RunLog | None = None
    try:
        remove_stale_temporaries(out)
        old_run = [] if resume else check_new_run(out, overwrite=overwrite)
        runlog = RunLog(out, tensorboard=t.tensorboard)
    except BaseException:
        if runlog is not None:
            runlog.close()
        lock.release()
        raise
    return lock, runlog, old_run


def start_over(out: Path, old_run: list[Path], runlog: RunLog, *, resume: bool) -> None:
    """Rank 0, once a new run has passed every check: remove the old run (`--overwrite`) and its records."""
    if resume:
        return
    removed = remove_old_run(old_run)
    if removed:
        runlog.log(f"--overwrite: removed the previous run's {removed} checkpoints from {out}")
    runlog.drop_after(0)  # records of an earlier start that left no checkpoint (a new run's own come after)


def resume_point(out: Path, *, log: Log) -> tuple[Path, dict]:
    """The checkpoint a resume continues from and its state: rank 0 picks the newest complete one, every rank loads that one."""
    chosen: dict = {}

    def pick() -> str:
        path, chosen["state"] = newest_checkpoint(out, log=log)
        return str(path)

    path = Path(runtime.on_main(pick))
    state = chosen.get("state") or load_checkpoint(path, map_location="cpu")
    check_checkpoint_weights(state, source=path, weights=("raw",))  # a resume restores the EMA itself (training.ema)
    return path, state


def init_point(cfg: Config, *, log: Log) -> tuple[Path, dict] | None:
    """The checkpoint a fine-tuning run starts from (``train.init_from``) and its state, or None for a new model;
    its weights checked (:func:`check_checkpoint_weights`) before the line that says so is logged."""
    if not cfg.train.init_from:
        return None
    path = Path(cfg.train.init_from)
    state = load_checkpoint(path, map_location="cpu")
    check_checkpoint_weights(
        state, source=path, weights=(None,)
    )  # what initialize() loads: the EMA weights when present
    log(
        f"starting from the weights, architecture and tokenizer of {path} (train.init_from), with a fresh optimizer and schedule"
    )
    return path, state


def check_checkpoint_weights(state: dict, *, source: Path, weights: tuple[str | None, ...]) -> None:
    """The weights a run takes from a checkpoint (``weights``: as checkpoint.model_weights names them), checked
    against the model its config makes with its tokenizers before any model is built (decoding.rebuild.check_fit:
    the size bound, names, shapes and dtypes, the file's bytes)."""
    saved = config_from_checkpoint(state, source=str(source))
    src_tok, tgt_tok = tokenizers_from_checkpoint(state, saved, source=str(source))
    file_bytes = source.stat().st_size if source.is_file() else None
    for which in weights:
        chosen = model_weights(state, weights=which, source=str(source))
        check_fit(
            saved.model,
            chosen,
            src_vocab_size=src_tok.vocab_size,
            tgt_vocab_size=tgt_tok.vocab_size,
            source=str(source),
            file_bytes=file_bytes,
        )


def tokenizers(cfg: Config, state: dict | None, *, source: str, log: Log) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers: a resumed run's own, or the checkpoint's a fine-tuning run starts from (``state``); for a new
    run rank 0 trains or reads them, and the other ranks get the models, not a path they may not see."""
    if state is None:

        def prepare() -> dict:
            return pack_tokenizer_pair(*prepare_tokenizers(cfg, log=log))

        state = {"tokenizers": runtime.on_main(prepare)}
    return tokenizers_from_checkpoint(state, cfg, source=source)


# ---------------------------------------------------------------- the train state
def build_state(
    cfg: Config, t: TrainConfig, toks: tuple[Tokenizer, Tokenizer], *, device: torch.device, keeps_ema: bool
) -> TrainState:
    """A new run's model, optimizer, schedule, fp16 scaler and EMA. `keeps_ema`: this rank validates and saves,
    so it alone keeps the moving average (of the unwrapped model)."""
    model = Transformer(cfg.model, src_vocab_size=toks[0].vocab_size, tgt_vocab_size=toks[1].vocab_size).to(device)
    optimizer = build_optimizer(model, t)
    return TrainState(
        cfg=cfg,
        train_cfg=t,
        tokenizers=toks,
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, t, d_model=cfg.model.d_model),
        scaler=torch.amp.GradScaler("cuda") if t.dtype == "float16" else None,
        ema=EMA(model, decay=t.ema_decay) if t.ema_decay > 0 and keeps_ema else None,
        progress=Progress(),
    )


def initialize(state: TrainState, init: dict, *, source: Path) -> None:
    """A fine-tuning run's first weights: the checkpoint's (its EMA weights when it has them, as decoding takes them),
    and the moving average restarted from them. Optimizer, schedule and progress stay fresh."""
    try:
        state.model.load_state_dict(model_weights(init, source=str(source)))
    except RuntimeError as exc:  # missing, unexpected or differently shaped tensors: torch lists them, one per line
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).strip())
        raise TrainError(
            f"--init-from {source}: the weights do not fit its config ({first.rstrip('.')}); the checkpoint was damaged or edited"
        ) from None
    if state.ema is not None:
        state.ema.reset()


def restore(state: TrainState, saved: dict, *, source: Path, restore_rng: bool, runlog: RunLog) -> None:
    """A resume: the checkpoint's state back, and the log told what changed since it."""
    changed = state.load_state_dict(saved, source=str(source), restore_rng=restore_rng, log=runlog.log)
    p = state.progress
    runlog.log(f"resumed from {source} at update {p.update}, epoch {p.epoch}")
    for change in changed:
        runlog.log(f"resuming with {change}: applied from update {p.update + 1} on (Adam's moment estimates are kept)")
    dropped = runlog.drop_after(p.update)
    if dropped:
        runlog.log(
            f"metrics.jsonl: {dropped} records after update {p.update} removed (written after that checkpoint; trained again now)"
        )


# ---------------------------------------------------------------- the data
def load_data(
    cfg: Config, state: TrainState, src_tok: Tokenizer, tgt_tok: Tokenizer, *, resumed: bool, quiet: bool, log: Log
) -> tuple[Corpus, ParallelData | None]:
    """The training corpus (re-segmented every epoch with data.subword_alpha) and the checked validation set
    (None without one); with model.restrict_output, a new model's kept output pieces (a resumed one keeps its checkpoint's)."""
    train_data: Corpus
    train_data, valid_data = runtime.main_first(lambda: load_corpora(cfg, src_tok, tgt_tok, quiet=quiet))
    if train_data.num_pairs == 0:  # before the summary, so the line that says what is wrong stands alone
        s = train_data.summary
        raise TrainError(
            f"{cfg.data.train_src}: no training pairs left after filtering ({s.pairs_read:,} read: {s.dropped_empty:,} empty, "
            f"{s.dropped_too_long:,} over data.max_len={s.max_len} pieces, {s.dropped_ratio:,} over data.max_len_ratio={s.max_len_ratio:g}); "
            "check the files, data.max_len and data.max_len_ratio"
        )
    valid_summary, dropped = None, None
    if valid_data is not None:
        valid_summary = valid_data.summary.format()
        valid_data, dropped = checked_validation_set(
            valid_data, max_positions=cfg.model.max_positions, name=cfg.data.valid_src
        )
    log(f"training data: {train_data.summary.format()}")
    if cfg.model.restrict_output:
        if cfg.data.subword_alpha > 0:  # sampled segmentations use pieces the best one never does (scored as UNK)
            raise ConfigError(
                f"model.restrict_output keeps the pieces of the best segmentation of the training targets, but "
                f"data.subword_alpha={cfg.data.subword_alpha:g} samples others; set one of them off"
            )
        if not resumed:
            state.model.restrict_output_to(_target_pieces(train_data))
        log(
            f"output layer: {state.model.output_size:,} of {tgt_tok.vocab_size:,} target pieces (model.restrict_output)"
        )
    if cfg.data.subword_alpha > 0:
        d = cfg.data
        train_data = SampledSegmentation(
            train_data,
            src_tok,
            tgt_tok,
            alpha=d.subword_alpha,
            nbest=d.subword_nbest,
            seed=cfg.train.seed,
            max_len=d.max_len,
        )
        log(
            f"subword regularisation: training pairs re-segmented every epoch (alpha {d.subword_alpha:g}, nbest {d.subword_nbest})"
        )
    if valid_summary is not None:
        log(f"validation data: {valid_summary}")
        if dropped:
            log(dropped)
    return train_data, valid_data


def _target_pieces(data: ParallelData) -> torch.Tensor:
    """Every target id of the training pairs (repeats kept): the pieces model.restrict_output keeps (model.restrict_output_to)."""
    return torch.cat([torch.from_numpy(data.pair(i)[1].astype("int64")) for i in range(data.num_pairs)])


def check_valid_beam(t: TrainConfig, *, validates_bleu: bool, tgt_vocab_size: int) -> None:
    """The validation beam against the target vocabulary now, not at the first validation hours later (the
    config's own checks refused a beam below 1, so a problem here is the vocabulary's bound)."""
    if not validates_bleu or t.valid_bleu_sentences < 0:
        return
    if beam_problem(t.valid_beam, tgt_vocab_size=tgt_vocab_size) is not None:
        raise ConfigError(
            f"train.valid_beam={t.valid_beam}: the target vocabulary has {tgt_vocab_size} ids, enough for a beam "
            f"of at most {max_beam(tgt_vocab_size)}; lower train.valid_beam (1 = greedy)"
        )


def check_batching(progress: Progress, now: Batching, *, log: Log) -> None:
    """A resume continues at batch `batch_in_epoch` of its epoch's list; when the list itself changed (another
    corpus, max_tokens or seed) that position means other batches, so the epoch starts again, and the log says so."""
    was = progress.batching
    if was is not None and was != now and progress.batch_in_epoch:
        log(
            f"resuming: the batching changed since the checkpoint ({', '.join(was.changes(now))}): epoch {progress.epoch} starts again from its first "
            f"batch (batch {progress.batch_in_epoch} of the old list is another batch of the new one)"
        )
        progress.batch_in_epoch = 0
    progress.batching = now


def batching_of(cfg: Config, train_data: Corpus) -> Batching:
    """What this run's epoch batch lists depend on besides the epoch."""
    d, t = cfg.data, cfg.train
    return Batching.of(
        data=Path(train_data.summary.cache).name,
        max_tokens=t.max_tokens,
        seed=t.seed,
        subword_alpha=d.subword_alpha,
        subword_nbest=d.subword_nbest,
    )


def training_module(
    model: Transformer, t: TrainConfig, *, dist: runtime.DistInfo, device: torch.device
) -> tuple[torch.nn.Module, str]:
    """What the training forward runs: the loss module around the model, wrapped by DDP in a data-parallel run
    (the model itself is what is saved and validated); and the log's words for the processes."""
    module: torch.nn.Module = TeacherForcedLoss(model, label_smoothing=t.label_smoothing)
    if not dist.enabled:
        return module, ""
    where = f"; {dist.world_size} processes ({torch.distributed.get_backend()}), {dist.world_size * t.update_freq} batches per update"
    return runtime.wrap_ddp(module, device), where
