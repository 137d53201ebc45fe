"""The warm-up / stable / cool-down schedule (train.lr_schedule wsd): its value at fractions of the time or update
budget, a real run that ends cool, and a resume that continues the schedule where it stopped."""

from __future__ import annotations

import json
import types

import pytest
import torch

from tests.conftest import run_config
from transformer_mt.config import TrainConfig
from transformer_mt.training import (
    Trainer,
    UpdateStats,
    budget_fraction,
    build_scheduler,
    resumed_config,
    set_up,
    wsd_lr,
)
from transformer_mt.training import trainer as train_module

PEAK, WARMUP, COOLDOWN = 1e-3, 10, 0.2


def expected_wsd(
    update: int, fraction: float, *, peak: float = PEAK, warmup: int = WARMUP, cooldown: float = COOLDOWN
) -> float:
    """The schedule written out piece by piece (warm-up, stable, cool-down, after the budget), apart from optim.py's
    min() form."""
    rate = peak * update / warmup if update < warmup else peak
    if fraction >= 1.0:
        return 0.0
    if fraction > 1.0 - cooldown:
        rate = min(rate, peak * (1.0 - fraction) / cooldown)
    return rate


def scheduler_with_clock(cfg: TrainConfig):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    scheduler = build_scheduler(optimizer, cfg, d_model=8)
    now = [0.0]
    scheduler.clock = lambda: now[0]
    return optimizer, scheduler, now


def test_wsd_values_at_fractions_of_max_time():
    cfg = TrainConfig(lr_schedule="wsd", lr=PEAK, warmup_updates=WARMUP, cooldown=COOLDOWN, max_time=10.0)  # 600 s
    optimizer, scheduler, now = scheduler_with_clock(cfg)
    assert scheduler.lr == pytest.approx(PEAK / 10)  # update 1 of a 10-update warm-up
    done = 0
    # (updates finished, training seconds then, the rate of the next update by hand)
    for updates, seconds, by_hand in [
        (4, 60.0, PEAK * 0.5),
        (50, 300.0, PEAK),
        (60, 480.0, PEAK),
        (70, 540.0, PEAK * 0.5),
        (80, 594.0, PEAK * 0.05),
        (90, 600.0, 0.0),
        (95, 660.0, 0.0),
    ]:
        while done < updates:
            done += 1
            now[0] = seconds
            scheduler.step()
        assert scheduler.lr == pytest.approx(by_hand, abs=1e-12)
        assert scheduler.lr == pytest.approx(expected_wsd(updates + 1, seconds / 600.0), abs=1e-12)
        assert optimizer.param_groups[0]["lr"] == scheduler.lr  # applied, not only reported


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.8, 0.85, 0.9, 0.97, 1.0, 1.2])
@pytest.mark.parametrize("update", [1, 5, 10, 11, 1000])
def test_wsd_formula_matches_the_pieces(update, fraction):
    assert wsd_lr(update, fraction, peak=PEAK, warmup=WARMUP, cooldown=COOLDOWN) == pytest.approx(
        expected_wsd(update, fraction), abs=1e-15
    )
    assert wsd_lr(update, fraction, peak=PEAK, warmup=0, cooldown=COOLDOWN) == pytest.approx(
        expected_wsd(update, fraction, warmup=0), abs=1e-15
    )


def test_budget_fraction_is_the_budget_that_ends_first():
    assert budget_fraction(100, 540.0, max_time=10.0) == pytest.approx(0.9)
    assert budget_fraction(900, 60.0, max_updates=1000) == pytest.approx(0.9)
    assert budget_fraction(100, 540.0, max_time=10.0, max_updates=1000) == pytest.approx(0.9)  # time ends first
    assert budget_fraction(900, 60.0, max_time=10.0, max_updates=1000) == pytest.approx(0.9)  # updates end first
    assert budget_fraction(5, 5.0) == 0.0


def test_scheduler_state_resumes_the_same_rate_and_continues():
    cfg = TrainConfig(lr_schedule="wsd", lr=PEAK, warmup_updates=WARMUP, cooldown=0.5, max_time=1.0)
    _, straight, now = scheduler_with_clock(cfg)
    rates = []
    for k in range(1, 21):
        now[0] = 3.0 * k
        straight.step()
        rates.append(straight.lr)
    _, first, now_a = scheduler_with_clock(cfg)
    for k in range(1, 15):  # stopped inside the cool-down (it starts at 30 s), where the rate depends on the clock
        now_a[0] = 3.0 * k
        first.step()
    _, second, now_b = scheduler_with_clock(cfg)
    second.load_state_dict(first.state_dict())
    assert second.lr == rates[13]  # the same rate for the coming update as before the save
    resumed = []
    for k in range(15, 21):
        now_b[0] = 3.0 * k
        second.step()
        resumed.append(second.lr)
    assert resumed == rates[14:]


# ---------------------------------------------------------------- real runs with a fake training clock
TINY = [
    "train.threads=1",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "train.max_tokens=300",
    "train.valid_bleu_sentences=-1",
    "train.validate_every=1000",
    "model.dropout=0.0",
    "train.log_every=5",
]
TICK = 3.0  # fake seconds per update: a 1-minute budget is 20 updates
WSD = ["train.lr_schedule=wsd", f"train.lr={PEAK}", "train.warmup_updates=4", "train.cooldown=0.5"]


@pytest.fixture
def fake_clock(monkeypatch):
    """train.py's time.monotonic replaced by a clock that moves TICK seconds per optimizer step (only then),
    so a max_time run has a known number of updates on any machine; perf_counter stays real."""
    now = [1000.0]
    monkeypatch.setattr(
        train_module,
        "time",
        types.SimpleNamespace(monotonic=lambda: now[0], perf_counter=train_module.time.perf_counter),
    )

    def attach(trainer: Trainer) -> Trainer:
        trainer.optimizer.register_step_post_hook(lambda *_: now.__setitem__(0, now[0] + TICK))
        return trainer

    return attach


def budget_options(budget: str) -> list[str]:
    return ["train.max_time=1.0"] if budget == "time" else ["train.max_updates=20"]


def by_hand(update: int) -> float:
    """Update u (1-based) starts after u - 1 updates, i.e. at fraction (u - 1) / 20 of either budget."""
    return expected_wsd(update, (update - 1) / 20, warmup=4, cooldown=0.5)


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["time", "updates"])
def test_a_run_cools_to_zero_at_the_end_of_its_budget(pairs64, spm_model, tmp_path, fake_clock, budget):
    rates = []
    cfg = run_config(pairs64, spm_model, tmp_path / "run", *TINY, *WSD, *budget_options(budget))
    trainer = fake_clock(Trainer(set_up(cfg, resume=False), on_update=lambda u, s: rates.append(s.lr)))
    result = trainer.run()
    assert result.progress.update == 20 and ("max_time" if budget == "time" else "max_updates") in result.stop_reason
    assert rates == pytest.approx([by_hand(u) for u in range(1, 21)], abs=1e-12)
    assert rates[3] == pytest.approx(PEAK) and rates[-1] == pytest.approx(
        PEAK * 0.1
    )  # the last update: 1 / 20 of the budget left
    assert trainer.scheduler.lr == 0.0  # the budget is spent: the next rate would be 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {
        r["update"]: r["lr"] for r in records if r["kind"] == "train"
    }  # the lr column: the rate of each logged update
    assert logged.keys() == {5, 10, 15, 20}
    assert [logged[u] for u in sorted(logged)] == pytest.approx([by_hand(u) for u in sorted(logged)], abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["time", "updates"])
def test_resume_keeps_the_schedule_continuous(pairs64, spm_model, tmp_path, fake_clock, budget):
    straight, first, second = [], [], []
    fake_clock(
        Trainer(
            set_up(run_config(pairs64, spm_model, tmp_path / "a", *TINY, *WSD, *budget_options(budget)), resume=False),
            on_update=lambda u, s: straight.append(s.lr),
        )
    ).run()

    def stop_after_14(update: int, stats: UpdateStats) -> None:  # inside the cool-down, which starts half-way
        first.append(stats.lr)
        if update == 14:
            interrupted.stopping.request()  # as a SIGINT would: save checkpoint_last.pt and stop

    interrupted = fake_clock(
        Trainer(
            set_up(run_config(pairs64, spm_model, tmp_path / "b", *TINY, *WSD, *budget_options(budget)), resume=False),
            on_update=stop_after_14,
        )
    )
    assert interrupted.run().stop_reason == "interrupted"
    resumed = fake_clock(
        Trainer(set_up(resumed_config(tmp_path / "b", []), resume=True), on_update=lambda u, s: second.append(s.lr))
    )
    assert resumed.scheduler.lr == pytest.approx(straight[14], abs=1e-15)  # the restored rate of update 15
    resumed.run()
    assert len(first) == 14 and first + second == pytest.approx(straight, abs=1e-15)
    assert straight == pytest.approx([by_hand(u) for u in range(1, 21)], abs=1e-12)
