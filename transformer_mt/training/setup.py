"""Setting up a run for the training loop: `set_up` builds everything the Trainer trains with, as one `Run`
(run.py), in an order its docstring states once. Beside it the steps that belong to no other module: this process
(device, dtype, threads, the torchrun job), starting over an old run, the train state, and the module the training
forward runs. Elsewhere: the config a run trains with (run_config.py), where it starts from and its tokenizers
(start.py), its data (corpora.py), its directory (rundir.py), validation's early check (validation.py).

Data parallel (torchrun, WORLD_SIZE > 1): each process joins the job (NCCL on GPUs, one GPU per process; Gloo
on CPU). RNG on resume: rank 0 restores the checkpoint's generator states; rank r > 0 reseeds with
runtime.seed_for_rank(seed, r, update), as at the start of a run (update 0). Batch order never depends on these
generators, only dropout does, so a resumed multi-process run with dropout differs from an uninterrupted one in the
dropout masks of ranks > 0 only.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.checkpoint import config_from_checkpoint, model_weights
from transformer_mt.config import Config, TrainConfig, save_config
from transformer_mt.model import (
    TeacherForcedLoss,
    Transformer,
    choose_ops,
    count_parameters,
    is_adapter_name,
    merge_lora_weights,
)
from transformer_mt.model.ops.compiling import Compiler, CompileSettings, compile_model, compile_setting, pad_multiple
from transformer_mt.text import Tokenizer
from transformer_mt.training.corpora import batching_of, check_batching, load_data
from transformer_mt.training.ema import EMA
from transformer_mt.training.finetuning import TrainedShare, prepare_for_training
from transformer_mt.training.optim import build_optimizer, build_scheduler
from transformer_mt.training.policy import CheckpointPolicy
from transformer_mt.training.run import Run, RunData, TrainError, main_rank_work
from transformer_mt.training.rundir import RunDir, remove_old_run
from transformer_mt.training.runlog import RunLog
from transformer_mt.training.start import init_point, resume_point, tokenizers
from transformer_mt.training.state import Progress, TrainState
from transformer_mt.training.validation import Validator, check_valid_beam


def set_up(cfg: Config, *, resume: bool, overwrite: bool = False) -> Run:
    """Everything a run trains with, as one `Run`. With `resume`, the run continues from the newest complete
    checkpoint in cfg.train.out_dir; a new run refuses a directory holding one, unless `overwrite` (its checkpoints
    are removed; rundir.py). When a step fails, what the earlier ones opened is closed again.

    The order is part of the behaviour:
    1. this process (device, dtype, threads, the torchrun job) before anything runs on it;
    2. rank 0 locks the run directory before anything is written there, and refuses an old run there before any
       work (with --overwrite it notes the old run's checkpoints instead, removed in step 7);
    3. the generators are seeded before the model is built: identical initial parameters on every rank, and the
       stream a resumed run then restores;
    4. the checkpoint the run starts from (a resume's, or train.init_from's) before the tokenizers, which it holds,
       and the tokenizers before the model, whose vocabularies they size;
    5. the train state built, then restored or initialised from that checkpoint, before the data is read
       (model.restrict_output takes a new model's output pieces from the training data, a resumed one keeps its
       checkpoint's); ranks other than 0 reseed after that, for dropout masks of their own;
    6. the data, and the checks that must fail now rather than hours into training;
    7. only once every check has passed, rank 0 removes an old run (--overwrite) and writes config.yaml;
    8. last, the module the training forward runs (DDP-wrapped in a data-parallel run), its layers and loss
       compiled first when train.compile says so.
    """
    dist = runtime.dist_info()
    with contextlib.ExitStack() as on_failure:  # what the steps so far opened, closed when a later one fails
        # 1. the process
        t, device, owns_group = process(cfg, dist)
        if owns_group:
            on_failure.callback(runtime.shutdown_distributed)

        # 2. the run directory and its log; the other ranks hold no lock, and their log is silent
        out = Path(cfg.train.out_dir)
        run_dir, runlog = RunDir(out), RunLog(None)
        with main_rank_work():
            if dist.is_main:
                run_dir = RunDir.open(out, resume=resume, overwrite=overwrite)
                on_failure.callback(run_dir.release)
                runlog = RunLog(out, tensorboard=t.tensorboard)
                on_failure.callback(runlog.close)
        log = runlog.log

        # 3. the generators, the same on every rank
        runtime.seed_everything(t.seed)

        # 4. the checkpoint the run starts from, and the tokenizers
        resumed = resume_point(out, log=log) if resume else None
        init = None if resume else init_point(cfg, log=log)
        start = resumed or init
        source = str(resumed[0] if resumed else cfg.train.init_from)
        toks = tokenizers(cfg, start[1] if start else None, source=source, log=log)

        # 5. the train state
        state = build_state(cfg, t, toks, device=device, keeps_ema=dist.is_main)
        if resumed is not None:  # rank r > 0 reseeds below instead of restoring the generators
            restore(state, resumed[1], source=resumed[0], restore_rng=dist.is_main, runlog=runlog)
        elif init is not None:
            initialize(state, init[1], source=init[0])
        if dist.rank > 0:  # its own dropout masks; rank 0 keeps the single-process stream
            runtime.seed_everything(runtime.seed_for_rank(t.seed, dist.rank, state.progress.update))

        # 6. the data, and the checks that must fail now
        quiet = not sys.stderr.isatty() or not dist.is_main
        train_data, valid_data = load_data(cfg, state, *toks, resumed=resumed is not None, quiet=quiet, log=log)
        check_valid_beam(t, validates_bleu=valid_data is not None, tgt_vocab_size=toks[1].vocab_size)
        validator = None if valid_data is None else Validator(cfg, valid_data, toks, device=device, log=log)
        check_batching(state.progress, batching_of(cfg, train_data), log=log)

        # 7. every check has passed: only now is an old run removed (--overwrite) and its config replaced
        with main_rank_work():
            if dist.is_main:
                start_over(run_dir, runlog, resume=resume)
                save_config(cfg, out / "config.yaml")
        log(
            f"model: {count_parameters(state.model):,} parameters; device {device}, dtype {t.dtype}, "
            f"{torch.get_num_threads()} threads{processes(dist, t)}"
        )
        share = TrainedShare.of(state.model)
        if share.frozen:  # LoRA or frozen parts: what trains, and what it holds in memory
            log(share.describe())

        # 8. the module the training forward runs, built last and straight into the Run: a failure before it leaves
        # no DDP wrapper alive to outlive the process group (Run.close says why that matters)
        compiler = compile_for_training(state.model, t, log=log)
        run = Run(
            cfg=cfg,
            t=t,
            dist=dist,
            device=device,
            owns_group=owns_group,
            run_dir=run_dir,
            runlog=runlog,
            state=state,
            data=RunData(train=train_data, valid=valid_data, validator=validator),
            train_model=training_module(state.model, t, dist=dist, device=device),
            policy=CheckpointPolicy(out, cfg.train),
            resumed_from=resumed[0] if resumed else None,
            compiler=compiler,
        )
        on_failure.pop_all()  # set up: from here Run.close() releases it all
    return run


# ---------------------------------------------------------------- the process
def process(cfg: Config, dist: runtime.DistInfo) -> tuple[TrainConfig, torch.device, bool]:
    """This process's device, dtype and threads, and its place in a data-parallel job. Returns the train config
    it trains with (train.dtype, train.compile and train.pad_to_multiple resolved; the saved config keeps "auto" and
    0), the device, and whether it created the process group (and must leave it)."""
    t, device = cfg.train, runtime.pick_device(cfg.train.device)
    if t.dtype == "auto":  # chosen per machine and model (runtime.auto_dtype)
        t = replace(t, dtype=runtime.auto_dtype(device, d_model=cfg.model.d_model))
    compiling = compile_setting(
        t.compile, ops_name=choose_ops(t.ops, device, setting="train.ops").name, device_type=device.type
    )
    multiple = pad_multiple(
        t.pad_to_multiple,
        compiling=compiling != "off",
        longest=cfg.data.max_len + 1,
        max_positions=cfg.model.max_positions,
    )
    t = replace(t, compile=compiling, pad_to_multiple=multiple)
    runtime.check_dtype(t.dtype, device)
    runtime.set_threads(t.threads)
    runtime.reuse_freed_memory()  # every update allocates the same activations again
    if not dist.enabled:
        return t, device, False
    device, owns_group = runtime.init_distributed(dist, device)
    return t, device, owns_group


# ---------------------------------------------------------------- an old run, once the new one passed its checks
def start_over(run_dir: RunDir, runlog: RunLog, *, resume: bool) -> None:
    """Rank 0, once a new run has passed every check: remove the old run (`--overwrite`) and its records."""
    if resume:
        return
    removed = remove_old_run(run_dir.old_run)
    if removed:
        runlog.log(f"--overwrite: removed the previous run's {removed} checkpoints from {run_dir.path}")
    runlog.drop_after(0)  # records of an earlier start that left no checkpoint (a new run's own come after)


# ---------------------------------------------------------------- the train state
def build_state(
    cfg: Config, t: TrainConfig, toks: tuple[Tokenizer, Tokenizer], *, device: torch.device, keeps_ema: bool
) -> TrainState:
    """A new run's model, optimizer, schedule, fp16 scaler and EMA. `keeps_ema`: this rank validates and saves,
    so it alone keeps the moving average (of the unwrapped model)."""
    ops = choose_ops(t.ops, device, setting="train.ops")  # the backend for this device (model.ops)
    model = Transformer(cfg.model, src_vocab_size=toks[0].vocab_size, tgt_vocab_size=toks[1].vocab_size, ops=ops)
    model = prepare_for_training(model.to(device), t)  # train.lora's adapters, or train.freeze's parts frozen
    optimizer = build_optimizer(model, t)  # of the parameters that train
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
    """A fine-tuning run's first weights: the checkpoint's (its EMA weights when it has them, as decoding takes them,
    with a LoRA checkpoint's adapters merged in), and the moving average restarted from them. Optimizer, schedule and
    progress stay fresh; a LoRA run's new adapters keep their initialisation (B = 0: the model starts as the
    checkpoint)."""
    saved = config_from_checkpoint(init, source=str(source))
    # a LoRA checkpoint's adapters folded in: a LoRA run from it starts fresh adapters on its merged weights
    weights = merge_lora_weights(model_weights(init, source=str(source)), saved.model, saved.train.lora)
    try:
        missing, _ = state.model.load_state_dict(weights, strict=False)
        if any(not is_adapter_name(name) for name in missing) or weights.keys() - state.model.state_dict().keys():
            state.model.load_state_dict(weights)  # torch names the first missing or unexpected tensor
    except RuntimeError as exc:  # missing, unexpected or differently shaped tensors: torch lists them, one per line
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).strip())
        raise TrainError(
            f"--init-from {source}: the weights do not fit its config ({first.rstrip('.')}); the checkpoint was "
            "damaged or edited"
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
            f"metrics.jsonl: {dropped} records after update {p.update} removed "
            "(written after that checkpoint; trained again now)"
        )


# ---------------------------------------------------------------- the training forward
def training_module(
    model: Transformer, t: TrainConfig, *, dist: runtime.DistInfo, device: torch.device
) -> torch.nn.Module:
    """What the training forward runs: the loss module around the model, wrapped by DDP in a data-parallel run (the
    model itself is what is saved and validated)."""
    module: torch.nn.Module = TeacherForcedLoss(model, label_smoothing=t.label_smoothing)
    return runtime.wrap_ddp(module, device) if dist.enabled else module


def compile_for_training(model: Transformer, t: TrainConfig, *, log: Callable[[str], None]) -> Compiler | None:
    """train.compile (resolved: on, aot_eager or off): the model's layers and loss compiled in place
    (model.ops.compiling), and one log line saying so; None when off. The trainer logs the graph counts at the end."""
    if t.compile == "off":
        return None
    backend = "inductor" if t.compile == "on" else t.compile
    compiler = Compiler(CompileSettings(backend=backend, mode=t.compile_mode), log=log)
    compiled = compile_model(model, compiler)
    log(
        f"torch.compile ({backend}{'' if t.compile_mode == 'default' else ' ' + t.compile_mode}): "
        f"{len(compiled.layers)} layers{' and the loss' if compiled.loss else ''} of the {compiled.ops.name} backend, "
        f"compiled on first use; sequences padded to a multiple of {t.pad_to_multiple}"
    )
    return compiler


def processes(dist: runtime.DistInfo, t: TrainConfig) -> str:
    """The model line's words for the processes of a data-parallel run ("" for one process)."""
    if not dist.enabled:
        return ""
    backend = torch.distributed.get_backend()
    return f"; {dist.world_size} processes ({backend}), {dist.world_size * t.update_freq} batches per update"
