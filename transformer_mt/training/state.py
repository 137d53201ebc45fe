"""The train state: what a checkpoint holds of a run so that a resumed run continues exactly.

`TrainState.state_dict()` is the checkpoint (the "transformer_mt/1" layout of checkpoint/io.py: model,
config, tokenizers, optimizer, scheduler, scaler, rng, progress, metrics, and ema when kept), and
`load_state_dict()` puts a loaded one back into a freshly built run. `Progress` is where training stands
(its ``state_dict()`` is the checkpoint's "progress" entry); `Batching` is what the epoch batch lists depend on,
so that a resume knows whether `Progress.batch_in_epoch` still points at the same batch. `TrainResult` is what
a run reports when it stops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import (
    CheckpointError,
    config_from_checkpoint,
    pack_tokenizer_pair,
    rng_state,
    set_rng_state,
)
from transformer_mt.config import Config, TrainConfig, to_dict
from transformer_mt.model import Transformer
from transformer_mt.text import Tokenizer
from transformer_mt.training.ema import EMA
from transformer_mt.training.optim import Scheduler, restore_optimizer


@dataclass(frozen=True)
class Batching:
    """What the epoch batch lists depend on besides the epoch. Saved as the text "data=D max_tokens=M seed=S
    subword=A/N", and with several corpora " corpora=NAME*WEIGHT,... temperature=T" after it (`to_text`, read back
    by `parse`: the one place that reads it), the form every checkpoint has."""

    data: str  # the encoded training corpora: their caches' names, joined by "+" (each key covers the files,
    # tokenizer, length filters, tags and cleaning rules)
    max_tokens: int  # train.max_tokens
    seed: int  # train.seed: the shuffle of every epoch
    subword_alpha: float  # data.subword_alpha, at the text's precision (%g), so that a saved one compares equal
    subword_nbest: int  # data.subword_nbest
    corpora: str = ""  # data.corpora as "name*weight,..." (weights exact); empty for the one-corpus shorthand
    temperature: float = 0.0  # data.sampling_temperature (with corpora)

    @classmethod
    def of(
        cls,
        *,
        data: str,
        max_tokens: int,
        seed: int,
        subword_alpha: float,
        subword_nbest: int,
        corpora: str = "",
        temperature: float = 0.0,
    ) -> Batching:
        return cls(data, max_tokens, seed, float(f"{subword_alpha:g}"), subword_nbest, corpora, temperature)

    def _parts(self) -> dict[str, str]:
        parts = {
            "data": self.data,
            "max_tokens": str(self.max_tokens),
            "seed": str(self.seed),
            "subword": f"{self.subword_alpha:g}/{self.subword_nbest}",
        }
        if self.corpora:  # absent for the shorthand: its text is what it always was
            parts.update(corpora=self.corpora, temperature=repr(self.temperature))
        return parts

    def to_text(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self._parts().items())

    @classmethod
    def parse(cls, text: str) -> Batching | None:
        """The saved text back; None for "" (a checkpoint written before the fingerprint existed)."""
        if not text:
            return None
        try:
            parts = dict(kv.split("=", 1) for kv in text.split())
            alpha, nbest = parts["subword"].split("/")
            return cls.of(
                data=parts["data"],
                max_tokens=int(parts["max_tokens"]),
                seed=int(parts["seed"]),
                subword_alpha=float(alpha),
                subword_nbest=int(nbest),
                corpora=parts.get("corpora", ""),
                temperature=float(parts.get("temperature", "0")),
            )
        except (KeyError, ValueError):
            raise CheckpointError(
                f"progress.batching {text!r} is not 'data=... max_tokens=... seed=... subword=A/N'; the checkpoint is "
                "damaged, resume from another one"
            ) from None

    def changes(self, now: Batching) -> list[str]:
        """What differs in `now`, as "key old -> new"."""
        was, new = self._parts(), now._parts()
        keys = list(dict.fromkeys([*was, *new]))
        return [f"{key} {was.get(key, '-')} -> {new.get(key, '-')}" for key in keys if was.get(key) != new.get(key)]


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
    flops: float = 0.0  # analytic training FLOPs, 3 x forward of every padded batch (runtime/flops.py; all ranks)
    update_seconds: float = 0.0  # seconds inside updates (validation and checkpoints excluded)
    batching: Batching | None = None  # what batch_in_epoch refers to; a resume checks it before using batch_in_epoch
    # with several corpora: target tokens trained on from each (pieces + EOS, all ranks), by corpus name
    corpus_tokens: dict[str, int] = field(default_factory=dict)

    def count_update(
        self,
        *,
        epoch: int,
        batch_in_epoch: int,
        tokens: int,
        flops: float,
        seconds: float,
        corpora: dict[str, int] | None = None,
    ) -> None:
        """One more update done: where it leaves the epoch's batch list, and what it adds to the run's totals
        (``corpora``: its target tokens by corpus, with several)."""
        self.epoch, self.batch_in_epoch = epoch, batch_in_epoch
        self.update += 1
        self.tokens += tokens
        self.flops += flops
        self.update_seconds += seconds
        for name, n in (corpora or {}).items():
            self.corpus_tokens[name] = self.corpus_tokens.get(name, 0) + int(n)

    def validated(self, metric: float, *, improved: bool) -> None:
        """Count a validation at this update: a new best, or one more without improvement."""
        self.last_validated = self.update
        if improved:
            self.best, self.bad_validations = metric, 0
        else:
            self.bad_validations += 1

    def state_dict(self) -> dict[str, Any]:
        """Plain types, the fingerprint as its text."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["batching"] = self.batching.to_text() if self.batching is not None else ""
        out["corpus_tokens"] = dict(self.corpus_tokens)
        if not self.corpus_tokens:  # one corpus: the entry a checkpoint always had, nothing more
            del out["corpus_tokens"]
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Progress:
        return cls(**{**state, "batching": Batching.parse(state.get("batching", ""))})


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports."""

    out_dir: Path
    progress: Progress
    stop_reason: str
    last_validation: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainState:
    """Everything of a run that a checkpoint saves and a resume restores."""

    cfg: Config  # saved as given (train.dtype "auto" stays "auto")
    train_cfg: TrainConfig  # what this process trains with (the dtype resolved): the optimizer is built from it
    tokenizers: tuple[Tokenizer, Tokenizer]  # (src, tgt), saved in every checkpoint
    model: Transformer
    optimizer: torch.optim.Optimizer
    scheduler: Scheduler
    scaler: torch.amp.GradScaler | None  # fp16 loss scaling only
    ema: EMA | None  # with train.ema_decay > 0, on the rank that saves
    progress: Progress = field(default_factory=Progress)
    metrics: dict[str, float] = field(default_factory=dict)  # the latest validation's results

    def state_dict(self, *, elapsed: float | None = None) -> dict[str, Any]:
        """The checkpoint; `elapsed`: the run's training seconds now, in place of `progress.elapsed`."""
        progress = self.progress.state_dict()
        if elapsed is not None:
            progress["elapsed"] = elapsed
        state = {
            "model": self.model.state_dict(),
            "config": to_dict(self.cfg),
            "tokenizers": pack_tokenizer_pair(*self.tokenizers),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng_state(),
            "progress": progress,
            "metrics": dict(self.metrics),
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(
        self, state: dict[str, Any], *, source: str, restore_rng: bool = True, log: Callable[[str], None] = print
    ) -> list[str]:
        """Restore a checkpoint of this run (`source` names it in messages); returns the optimizer settings that
        changed since it (applied from the next update, optim.restore_optimizer). `restore_rng`: False on ranks
        that reseed instead (trainer.py)."""
        self.model.load_state_dict(state["model"])
        saved = config_from_checkpoint(state, source=source).train
        changed = restore_optimizer(
            self.optimizer, state["optimizer"], model=self.model, saved_cfg=saved, train_cfg=self.train_cfg
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"], source=source)
        elif self.ema is not None:
            self.ema.reset()
            log(
                f"train.ema_decay={self.train_cfg.ema_decay:g}: {source} holds no EMA weights; the average starts from "
                "its weights"
            )
        self.progress = Progress.from_state_dict(state["progress"])
        if restore_rng:
            set_rng_state(state["rng"])
        return changed
