"""The config of `tmt train`: a new run's from --config, a fine-tuning run's with the architecture and tokenizer of
the checkpoint it starts from (--init-from), or a resumed run's from its newest checkpoint (--resume)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformer_mt import runtime
from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint
from transformer_mt.config import Config, ConfigError, load_config, stated_keys, to_dict, validate
from transformer_mt.training.policy import newest_checkpoint


def train_config_from_cli(
    *, config: Path | None, overrides: list[str], resume: Path | None, overwrite: bool, init_from: Path | None = None
) -> Config:
    """The config of `tmt train`: from --config (with --init-from, the checkpoint's architecture and tokenizer),
    or from the run being resumed (--resume)."""
    if resume is not None and overwrite:
        raise ConfigError(f"--overwrite starts a new run, --resume {resume} continues one; give one of them")
    if resume is not None and init_from is not None:
        raise ConfigError(
            f"--init-from starts a new run from a checkpoint's weights, --resume {resume} continues one; "
            "give one of them"
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
            f"tmt train: resuming {resume}: its saved config is used, --config {config} is ignored "
            "(use --set to change values)",
            file=sys.stderr,
        )
    return resumed_config(resume, overrides)


# Model keys a fine-tuning run may set for itself: regularisation, not architecture.
FINE_TUNING_KEYS = ("model.dropout", "model.attention_dropout", "model.activation_dropout")


def initialized_config(cfg: Config, stated: dict[str, str]) -> Config:
    """``cfg`` with ``train.init_from``'s model and tokenizer sections: the weights fit only the architecture and
    vocabulary they were trained with. A key the config states (``stated``: key -> file or --set) that contradicts
    the checkpoint is refused, naming both, except the dropout rates (:data:`FINE_TUNING_KEYS`), which stay the
    config's."""
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
                    f"{stated[dotted]}: {dotted}={mine[key]!r} contradicts --init-from {path}, "
                    f"whose {dotted} is {value!r}; remove it (the architecture and tokenizer come from the "
                    f"checkpoint; only {', '.join(FINE_TUNING_KEYS)} may change)"
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
            f"--resume {run_dir}: model.* and tokenizer.* cannot change when resuming; "
            "start a new run in another train.out_dir"
        )
    if cfg.train.lora != saved.train.lora or cfg.train.freeze != saved.train.freeze:  # the parameters that train
        raise ConfigError(
            f"--resume {run_dir}: train.lora and train.freeze cannot change when resuming (the optimizer holds the "
            "parameters they train); start a new run with --init-from one of its checkpoints"
        )
    cfg.train.out_dir = str(run_dir)
    return cfg
