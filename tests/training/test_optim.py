"""Adam set-up and the learning-rate schedules."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.conftest import tiny_model
from transformer_mt.config import TrainConfig
from transformer_mt.training import (
    Scheduler,
    build_optimizer,
    build_scheduler,
    inverse_sqrt_lr,
    linear_lr,
    noam_lr,
    param_groups,
)

# --------------------------------------------------------------------------- schedules


def test_noam_is_the_paper_formula_and_peaks_at_warmup():
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        want = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert noam_lr(step, d_model=512, warmup=4000, scale=1.0) == pytest.approx(want, rel=1e-12)
    assert noam_lr(4000, d_model=512, warmup=4000) == pytest.approx(1 / math.sqrt(512 * 4000))  # 6.99e-4
    assert noam_lr(1, d_model=512, warmup=4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(16_000, d_model=512, warmup=4000, scale=2.0) == pytest.approx(2.0 * 512**-0.5 / 126.49110640673517)
    rates = [noam_lr(s, d_model=256, warmup=100) for s in range(1, 1001)]
    assert max(range(1000), key=rates.__getitem__) + 1 == 100
    assert all(a < b for a, b in zip(rates[:99], rates[1:100])) and all(a > b for a, b in zip(rates[99:], rates[100:]))
    with pytest.raises(ValueError):
        noam_lr(0, d_model=512, warmup=4000)


def test_inverse_sqrt_reaches_peak_exactly_at_warmup():
    assert inverse_sqrt_lr(4000, peak=5e-4, warmup=4000) == 5e-4
    assert inverse_sqrt_lr(1, peak=5e-4, warmup=4000) == pytest.approx(5e-4 / 4000)
    assert inverse_sqrt_lr(2000, peak=5e-4, warmup=4000) == pytest.approx(2.5e-4)
    assert inverse_sqrt_lr(16_000, peak=5e-4, warmup=4000) == pytest.approx(2.5e-4)
    rates = [inverse_sqrt_lr(s, peak=1e-3, warmup=50) for s in range(1, 500)]
    assert max(rates) == 1e-3 and rates.index(max(rates)) + 1 == 50


def test_linear_warms_up_then_decays_to_zero_after_the_last_update():
    assert linear_lr(1, peak=4e-3, warmup=4, total=12) == pytest.approx(1e-3)
    assert linear_lr(4, peak=4e-3, warmup=4, total=12) == 4e-3
    # after the peak: 9 equal steps down (updates 4..12 get 9/9 .. 1/9 of it), 0 one update later
    assert [linear_lr(s, peak=9.0, warmup=4, total=12) for s in range(4, 14)] == pytest.approx(
        [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    )
    assert linear_lr(3, peak=1.0, warmup=0, total=10) == pytest.approx(8 / 11)
    with pytest.raises(ValueError):
        linear_lr(1, peak=1.0, warmup=5, total=5)
    cfg = TrainConfig(lr_schedule="linear", warmup_updates=2, lr=1e-3, max_updates=6)
    opt = build_optimizer(nn.Linear(2, 2), cfg)
    sched = build_scheduler(opt, cfg, d_model=8)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    assert seen == pytest.approx([linear_lr(s, peak=1e-3, warmup=2, total=6) for s in range(1, 7)])


@pytest.mark.parametrize("schedule", ["noam", "inverse_sqrt"])
def test_scheduler_sets_lr_per_update_and_state_round_trips(schedule):
    cfg = TrainConfig(lr_schedule=schedule, warmup_updates=10, lr=1e-3, lr_scale=2.0)
    fn = (
        (lambda s: noam_lr(s, d_model=64, warmup=10, scale=2.0))
        if schedule == "noam"
        else (lambda s: inverse_sqrt_lr(s, peak=1e-3, warmup=10))
    )

    def fresh():
        model = nn.Linear(4, 4)
        opt = build_optimizer(model, cfg)
        return model, opt, build_scheduler(opt, cfg, d_model=64)

    model, opt, sched = fresh()
    seen = []
    for _ in range(15):
        seen.append(opt.param_groups[0]["lr"])
        assert sched.lr == seen[-1]
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    assert seen == pytest.approx([fn(s) for s in range(1, 16)], rel=1e-12)
    state = sched.state_dict()
    assert state == {"num_updates": 15}
    _, opt2, sched2 = fresh()
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == sched2.lr == opt.param_groups[0]["lr"] == pytest.approx(fn(16))
    sched.step()
    sched2.step()
    assert sched2.lr == sched.lr == pytest.approx(fn(17))


# --------------------------------------------------------------------------- optimizer


def test_adam_uses_the_paper_settings_and_matches_reference_adam():
    cfg = TrainConfig(lr=1e-2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    ref_model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    ref_model.load_state_dict(model.state_dict())
    opt = build_optimizer(model, cfg)
    ref = torch.optim.Adam(ref_model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    assert type(opt) is torch.optim.Adam and opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    x = torch.randn(8, 5)
    for _ in range(3):
        for m, o in ((model, opt), (ref_model, ref)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_weight_decay_skips_biases_layernorm_and_embeddings():
    model = tiny_model(64)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.01))
    assert type(opt) is torch.optim.AdamW
    decay, no_decay = (opt.param_groups[0], opt.param_groups[1])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert not ids(decay) & ids(no_decay) and len(ids(decay) | ids(no_decay)) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 and "embed" not in names[id(p)] for p in decay["params"])
    assert id(model.src_embed.weight) in ids(no_decay) and id(model.output_proj.weight) in ids(no_decay)  # tied
    assert any(isinstance(m, nn.LayerNorm) for m in model.modules())
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.Linear)) and getattr(m, "bias", None) is not None:
            assert id(m.bias) in ids(no_decay)
    assert len(param_groups(nn.Linear(3, 3, bias=False), 0.1)) == 1
    assert isinstance(build_scheduler(opt, TrainConfig(), d_model=32), Scheduler)
