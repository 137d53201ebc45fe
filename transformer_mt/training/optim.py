"""Adam (section 5.3 of the paper) and the learning-rate schedules, as pure functions of the update.

Updates are counted from 1: update 1 is the first ``optimizer.step()``. The :class:`Scheduler`
sets the learning rate of the *next* update, so it is called once after each
``optimizer.step()`` (after every ``update_freq`` batches, not every batch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from transformer_mt.config import TrainConfig


def noam_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), the formula of section 5.3.

    Rises linearly for ``warmup`` updates, peaks at step == warmup with
    scale * (d_model * warmup)^-0.5, then decays as step^-0.5. warmup = 0 means no warm-up.
    """
    if step < 1:
        raise ValueError(f"update numbers start at 1, got {step}")
    if warmup == 0:
        return scale * d_model**-0.5 * step**-0.5
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt_lr(step: int, *, peak: float, warmup: int) -> float:
    """peak * min(step / warmup, sqrt(warmup / step)): fairseq's ``inverse_sqrt`` with warmup_init_lr = 0.

    Linear warm-up from 0 (update 1 gets peak / warmup), exactly ``peak`` at step == warmup,
    then peak * sqrt(warmup / step). It is the noam shape with the peak stated directly.
    """
    if step < 1:
        raise ValueError(f"update numbers start at 1, got {step}")
    if warmup < 1:
        raise ValueError(f"inverse_sqrt needs warmup >= 1, got {warmup}")
    return peak * min(step / warmup, math.sqrt(warmup / step))


def linear_lr(step: int, *, peak: float, warmup: int, total: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` updates, then linear decay that would reach 0 one update
    after ``total`` (fairseq's ``polynomial_decay`` with power 1 and end lr 0): update ``total``, the
    last, still gets peak / (total - warmup + 1). warmup = 0 starts at the peak.
    """
    if step < 1:
        raise ValueError(f"update numbers start at 1, got {step}")
    if total <= warmup:
        raise ValueError(f"linear needs total > warmup, got total={total} warmup={warmup}")
    if step <= warmup:
        return peak * step / warmup
    return peak * max(0, total - step + 1) / (total - warmup + 1)


def wsd_lr(step: int, fraction: float, *, peak: float, warmup: int, cooldown: float) -> float:
    """Warm-up / stable / cool-down: ``peak * min(step / warmup, 1, (1 - fraction) / cooldown)``, floored at 0.

    ``fraction`` is the share of the training budget used before this update (:func:`budget_fraction`).
    Linear warm-up from 0 over ``warmup`` updates (update 1 gets peak / warmup; warmup = 0 starts at the
    peak), ``peak`` until fraction 1 - cooldown, then a linear decay reaching 0 at fraction 1 (the WSD
    schedule of MiniCPM, Hu et al. 2024; Haegele et al. 2024). Keyed to a time budget, a run ends at a low
    rate on any machine. Where warm-up and cool-down overlap (a tiny budget) the lower of the two wins.
    """
    if step < 1:
        raise ValueError(f"update numbers start at 1, got {step}")
    if not 0.0 < cooldown <= 1.0:
        raise ValueError(f"wsd needs cooldown in (0, 1], got {cooldown}")
    warm = step / warmup if step < warmup else 1.0
    return peak * max(0.0, min(warm, (1.0 - fraction) / cooldown))


def budget_fraction(updates_done: int, seconds: float, *, max_updates: int = 0, max_time: float = 0.0) -> float:
    """The share of the training budget used after ``updates_done`` updates and ``seconds`` of training:
    seconds / (max_time minutes) and updates_done / max_updates, the larger of those set (whichever budget
    runs out first ends the run); 0 when neither is set."""
    used = [seconds / (max_time * 60)] if max_time > 0 else []
    used += [updates_done / max_updates] if max_updates > 0 else []
    return max(used, default=0.0)


class Scheduler:
    """Sets every param group's lr to ``lr_fn(update)`` for the coming update.

    ``num_updates`` counts finished updates; the optimizer always holds ``lr_fn(num_updates + 1)``.
    A budget-keyed schedule (wsd) is given ``fraction_fn(updates_done, seconds)`` and its rate is
    ``lr_fn(update, fraction)``; the seconds are read from ``clock`` (the trainer's training clock, host
    time: no device sync) at each :meth:`step`. The state is ``num_updates`` (and for wsd those ``seconds``),
    so resuming sets the same rate again and continues as an uninterrupted run.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_fn: Callable[..., float],
        *,
        fraction_fn: Callable[[int, float], float] | None = None,
    ):
        self.optimizer = optimizer
        self.lr_fn = lr_fn
        self.fraction_fn = fraction_fn
        self.clock: Callable[[], float] | None = None  # training seconds so far; set by the trainer
        self.num_updates = 0
        self.seconds = 0.0  # the clock at the last step
        self._apply()

    @property
    def lr(self) -> float:
        """The learning rate of the coming update."""
        if self.fraction_fn is None:
            return self.lr_fn(self.num_updates + 1)
        return self.lr_fn(self.num_updates + 1, self.fraction_fn(self.num_updates, self.seconds))

    def step(self) -> None:
        """Call after each ``optimizer.step()``."""
        self.num_updates += 1
        if self.fraction_fn is not None and self.clock is not None:
            self.seconds = float(self.clock())
        self._apply()

    def state_dict(self) -> dict:
        return {"num_updates": self.num_updates} | ({"seconds": self.seconds} if self.fraction_fn is not None else {})

    def load_state_dict(self, state: dict) -> None:
        self.num_updates = int(state["num_updates"])
        self.seconds = float(state.get("seconds", 0.0))  # absent in checkpoints from before wsd
        self._apply()

    def _apply(self) -> None:
        lr = self.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def build_scheduler(optimizer: torch.optim.Optimizer, train_cfg: TrainConfig, *, d_model: int) -> Scheduler:
    """The schedule named by ``train_cfg.lr_schedule`` (noam, inverse_sqrt, linear or wsd), already applied for
    update 1."""
    if train_cfg.lr_schedule == "noam":
        fn = functools.partial(noam_lr, d_model=d_model, warmup=train_cfg.warmup_updates, scale=train_cfg.lr_scale)
    elif train_cfg.lr_schedule == "inverse_sqrt":
        fn = functools.partial(inverse_sqrt_lr, peak=train_cfg.lr, warmup=train_cfg.warmup_updates)
    elif train_cfg.lr_schedule == "linear":
        fn = functools.partial(
            linear_lr, peak=train_cfg.lr, warmup=train_cfg.warmup_updates, total=train_cfg.max_updates
        )
    elif train_cfg.lr_schedule == "wsd":
        fn = functools.partial(wsd_lr, peak=train_cfg.lr, warmup=train_cfg.warmup_updates, cooldown=train_cfg.cooldown)
        budget = functools.partial(budget_fraction, max_updates=train_cfg.max_updates, max_time=train_cfg.max_time)
        return Scheduler(optimizer, fn, fraction_fn=budget)
    else:
        raise ValueError(f"train.lr_schedule={train_cfg.lr_schedule!r} is not one of noam, inverse_sqrt, linear, wsd")
    return Scheduler(optimizer, fn)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters split into a decayed group and a group without weight decay.

    Decayed: matrices (2-D or more) of linear layers. Not decayed: biases and LayerNorm gains
    (1-D: decay would pull them to 0, not towards the identity they start at) and nn.Embedding
    tables (a rare token's row gets few gradients, so decay would shrink it towards 0 between
    its appearances; with tied embeddings the output projection is that table too), as in minGPT.
    """
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():  # shared (tied) parameters appear once
        if p.requires_grad:
            (no_decay if p.ndim < 2 or id(p) in embedding else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, train_cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adam with the paper's betas and eps, or AdamW (decoupled decay, see :func:`param_groups`) when
    ``train_cfg.weight_decay`` > 0. Build it after moving the model to its device.

    Uses the fused implementation where this torch has one for the parameters' device (CUDA;
    CPU from torch 2.4), else foreach. The lr given here is a placeholder: the Scheduler sets it.
    """
    cls: type[torch.optim.Optimizer]
    if train_cfg.weight_decay > 0:
        cls, groups = torch.optim.AdamW, param_groups(model, train_cfg.weight_decay)
    else:
        cls, groups = torch.optim.Adam, [{"params": [p for p in model.parameters() if p.requires_grad]}]
    kwargs: dict[str, Any] = dict(
        lr=train_cfg.lr, betas=tuple(train_cfg.optimizer_betas), eps=train_cfg.optimizer_eps, weight_decay=0.0
    )
    try:
        return cls(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError):  # no fused kernel for this device or dtype in this torch
        return cls(groups, foreach=True, **kwargs)


OPTIMIZER_KEYS = ("weight_decay", "optimizer_betas", "optimizer_eps")  # the TrainConfig fields build_optimizer reads


def restore_optimizer(
    optimizer: torch.optim.Optimizer, saved: dict, *, model: nn.Module, saved_cfg: TrainConfig, train_cfg: TrainConfig
) -> list[str]:
    """Load a checkpoint's optimizer state into ``optimizer`` (built from ``train_cfg``); returns the
    optimizer settings that changed since the checkpoint (``saved_cfg``), as "key: old -> new".

    Unchanged settings: the state dict is loaded as it is (an exact resume). Changed ones: torch's
    ``load_state_dict`` would bring the old betas, eps and decay back with the state (and refuses
    outright when the decay turns Adam into AdamW: their parameter groups differ), so the saved state
    goes into an optimizer built from ``saved_cfg`` and each parameter's moments (``step``,
    ``exp_avg``, ``exp_avg_sq``: the same for Adam and AdamW) move into ``optimizer``, which keeps the
    new settings from the next update on.
    """
    changes = [
        f"train.{key}: {_shown(getattr(saved_cfg, key))} -> {_shown(getattr(train_cfg, key))}"
        for key in OPTIMIZER_KEYS
        if _shown(getattr(saved_cfg, key)) != _shown(getattr(train_cfg, key))
    ]
    if not changes:
        optimizer.load_state_dict(saved)
        return []
    old = build_optimizer(model, saved_cfg)
    old.load_state_dict(saved)
    for group in old.param_groups:
        for p in group["params"]:
            if p in old.state:
                optimizer.state[p] = old.state[p]
    return changes


def _shown(value: float | Sequence[float]) -> str:  # a float or a pair of floats (betas)
    return str(list(value)) if isinstance(value, (list, tuple)) else f"{value:g}"
