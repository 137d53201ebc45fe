"""Exponential moving average of the weights (`train.ema_decay`), as Marian's exponential smoothing and
fairseq's EMA keep one: validation and decoding use the average, training continues on the raw weights.

After update t + 1 (t = EMA updates before it, 0 for the first) every floating parameter's fp32 shadow becomes

    shadow <- decay_t * shadow + (1 - decay_t) * param,   decay_t = min(ema_decay, (1 + t) / (10 + t))

The warm-up is TensorFlow's ``tf.train.ExponentialMovingAverage`` rule with ``num_updates`` = t: decay_t starts
at 0.1, so the initial (random) weights weigh 0.1 after the first update instead of ema_decay (e.g. 0.999), and
reaches ema_decay after about 9 / (1 - ema_decay) updates.

Tied parameters (shared embeddings and output projection) are one tensor with several names: one shadow, exported
under every name. The model's buffers (the sinusoid table: a non-persistent constant) are not averaged; exports
take them from the model. Everything stays on the model's device and the decay is a host float, computed from a
host counter: an update is one ``torch._foreach_lerp_`` over all shadows, without a host-device sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from transformer_mt.errors import TmtError


class EMAError(TmtError, ValueError):
    """EMA state that does not fit the model (another architecture's checkpoint)."""


def ema_decay_at(ema_decay: float, updates: int) -> float:
    """decay_t = min(ema_decay, (1 + t) / (10 + t)) for t = `updates` EMA updates done before this one."""
    return min(ema_decay, (1.0 + updates) / (10.0 + updates))


class EMA:
    """fp32 shadow copies of `model`'s floating parameters that train, moved towards the parameters by `update()`."""

    def __init__(self, model: nn.Module, *, decay: float):
        if not 0.0 <= decay < 1.0:
            raise EMAError(f"train.ema_decay={decay} is outside [0, 1); use 0 (off) or e.g. 0.999")
        self.model, self.decay, self.updates = model, decay, 0
        # one entry per tensor (tied weights once); every name of each kept for exports
        self.params: list[torch.Tensor] = []  # the parameters themselves
        self.names: dict[str, int] = {}
        index: dict[int, int] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if not p.is_floating_point() or not p.requires_grad:  # a frozen weight (LoRA, train.freeze) is its own mean
                continue
            if id(p) not in index:
                index[id(p)] = len(self.params)
                self.params.append(p)
            self.names[name] = index[id(p)]
        self.shadow = [p.detach().to(torch.float32, copy=True) for p in self.params]
        # fp32 parameters (the usual case: low precision comes from autocast) are read in place
        self._same_dtype = all(p.dtype == torch.float32 for p in self.params)

    def reset(self) -> None:
        """Start again from the model's present weights (a resume from a checkpoint saved without EMA)."""
        with torch.no_grad():
            torch._foreach_copy_(self.shadow, self.params)
        self.updates = 0

    def update(self) -> None:
        """Move every shadow towards its parameter by 1 - decay_t (call after each optimizer step that was taken)."""
        weight = 1.0 - ema_decay_at(self.decay, self.updates)
        with torch.no_grad():
            params = self.params if self._same_dtype else [p.float() for p in self.params]
            torch._foreach_lerp_(self.shadow, params, weight)  # shadow + weight * (param - shadow)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self) -> Iterator[nn.Module]:
        """The model with the EMA weights inside the block (for validation); the raw weights, bit for bit, after it."""
        with torch.no_grad():
            raw = [p.detach().clone() for p in self.params]
            torch._foreach_copy_(self.params, self.shadow)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, raw)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict()`` with the EMA weights in place of the parameters (in their dtype): loadable by
        ``Transformer.load_state_dict``."""
        out = self.model.state_dict()
        for name, i in self.names.items():
            out[name] = self.shadow[i].to(out[name].dtype, copy=True)
        return out

    def state_dict(self) -> dict[str, Any]:
        """{"decay", "updates", "weights": {parameter name -> fp32 shadow}} (plain types: a checkpoint's "ema" entry).
        Tied names share one tensor, so a checkpoint stores it once."""
        return {
            "decay": self.decay,
            "updates": self.updates,
            "weights": {name: self.shadow[i] for name, i in self.names.items()},
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "checkpoint") -> None:
        """Restore `state_dict()`: the shadows and the update count (so the warm-up continues where it was). The decay
        stays the one this EMA was built with (train.ema_decay of the present config)."""
        weights = state["weights"]
        if weights.keys() != self.names.keys():
            missing, extra = sorted(self.names.keys() - weights.keys()), sorted(weights.keys() - self.names.keys())
            raise EMAError(
                f"{source}: its EMA weights do not fit the model (missing {missing[:3]}, unexpected {extra[:3]}); "
                "resume with the model.* settings it was trained with"
            )
        with torch.no_grad():
            for name, i in self.names.items():
                self.shadow[i].copy_(weights[name])
        self.updates = int(state["updates"])
