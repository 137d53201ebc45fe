"""Host syncs: the counter counts what makes a host wait for a GPU, on CPU, and the hot loops
stay within their budgets: one sync per training update (the gradient norm, for the NaN guard), one per
search step whatever the batch size and beam (the number of rows still running).

Expectations come from what each op is (an .item() is a sync, an index_select is not), not from the
counter's own output; the budgets are the issue's."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.conftest import run_config, tiny_model
from transformer_mt.data import collate
from transformer_mt.decoding import beam_search, greedy_search
from transformer_mt.model import DecoderCache, Ensemble, TeacherForcedLoss
from transformer_mt.runtime import SyncCounter, per_call
from transformer_mt.text import EOS_ID, PAD_ID
from transformer_mt.training import Trainer, UpdateStats, set_up, target_tokens, update_schedule

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 40


# ---------------------------------------------------------------- the counter itself
def test_counter_counts_the_ops_that_wait_and_nothing_else():
    x = torch.randn(6, requires_grad=True)
    with SyncCounter() as syncs:
        y = (x * 2).exp()  # none of these waits: arithmetic, reductions to a tensor, index tensors, sorting
        y.sum().backward()
        idx = torch.tensor([0, 2, 3])
        z = y.detach().index_select(0, idx).argsort()
        torch.arange(4).repeat_interleave(3)  # an int repeat: the size is known
        y.detach().topk(2)
        torch.where(x > 0, x, 0.0)
    assert syncs.total == 0 and not syncs.counts, syncs.summary()

    with SyncCounter() as syncs:
        x.sum().item()
        bool(x.sum() > 0)
        float(x.detach()[0])
        x.detach().tolist()
        x.detach().numpy()
        (x > 0).nonzero()
        torch.equal(x, x)
        torch.arange(3).repeat_interleave(torch.tensor([1, 2, 3]))
        masked = x[x > 0]  # a bool index: nonzero inside, and again in its backward (index_put)
        masked.sum().backward()
        with torch.inference_mode():  # item is composite there: counted all the same
            int(z.max())
    assert syncs.counts == {
        "item": 4,
        "tolist": 1,
        "numpy": 1,
        "nonzero": 1,
        "equal": 1,
        "repeat_interleave": 1,
        "index": 1,
        "index_put": 1,
    }
    assert syncs.total == 11
    assert torch.Tensor.tolist.__name__ == "tolist"  # patched only inside the block


def test_counter_names_the_line_in_the_package():
    cache = DecoderCache(
        torch.zeros(1, 4, 2, 3, 8), torch.zeros(1, 4, 2, 3, 8), torch.zeros(4, 3, dtype=torch.bool), None
    )
    with SyncCounter() as syncs:
        cache.reorder(torch.tensor([1, 1, 3, 3]))  # a bare reorder works its layout out: it reads the indices back
    assert syncs.total > 0 and all(site.startswith("cache.py:") for _, site in syncs.sites), syncs.summary()


# ---------------------------------------------------------------- training
def _trainer(files: dict, spm_model, out, *extra: str) -> Trainer:
    cfg = run_config(
        files,
        spm_model,
        out,
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_model=32",
        "model.heads=2",
        "model.d_ff=64",
        "train.max_tokens=300",
        "train.threads=1",
        "data.valid_src=",
        "data.valid_tgt=",
        *extra,
    )
    return Trainer(set_up(cfg, resume=False))


@pytest.mark.parametrize("update_freq", [1, 3])
def test_a_training_update_syncs_once(pairs64, spm_model, tmp_path, update_freq):
    """The budget is one sync per micro-batch; an update pays one whatever its number of micro-batches."""
    trainer = _trainer(pairs64, spm_model, tmp_path / "run", f"train.update_freq={update_freq}")
    try:
        for u in itertools.islice(update_schedule(trainer.train_data, trainer.t), 3):
            batches = [trainer.train_data.get_batch(idx) for idx in u.batches]  # collated on the host, before counting
            with SyncCounter() as syncs:
                stats = trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
            assert syncs.total == 1 and syncs.counts["item"] == 1, syncs.summary()  # the gradient norm
            assert not syncs.collectives  # one process: no all-reduce at all
            assert stats.tokens == sum(b.ntokens for b in batches)
            assert isinstance(stats.loss, torch.Tensor) and isinstance(stats.gnorm, float)  # read at log time
    finally:
        trainer.close()


def test_a_skipped_update_leaves_the_weights_adam_and_the_schedule_where_they_were(pairs64, spm_model, tmp_path):
    """The one sync of an update is what lets the host skip it: a NaN gradient norm means no Adam step and no
    advance of the learning-rate schedule (the next real update gets update 1's rate)."""
    trainer = _trainer(pairs64, spm_model, tmp_path / "run")
    try:
        schedule = iter(update_schedule(trainer.train_data, trainer.t))
        before = [p.detach().clone() for p in trainer.model.parameters()]
        u = next(schedule)
        handle = next(trainer.model.parameters()).register_hook(lambda g: torch.full_like(g, float("nan")))
        stats = trainer.update(
            [trainer.train_data.get_batch(i) for i in u.batches], ntokens=target_tokens(trainer.train_data, u.batches)
        )
        handle.remove()
        assert math.isnan(stats.gnorm) and trainer.scheduler.num_updates == 0 and not trainer.optimizer.state
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        u = next(schedule)
        stats = trainer.update(
            [trainer.train_data.get_batch(i) for i in u.batches], ntokens=target_tokens(trainer.train_data, u.batches)
        )
        assert math.isfinite(stats.gnorm) and trainer.scheduler.num_updates == 1
        assert stats.lr == trainer.scheduler.lr_fn(1)
        assert not all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    finally:
        trainer.close()


def test_distributed_stats_are_one_all_reduce_without_a_read(pairs64, spm_model, tmp_path):
    """Under a process group the update's statistics cost one all-reduce and no host read of their own;
    the token count comes from the lengths on the host (no all-reduce, no read)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        trainer = _trainer(pairs64, spm_model, tmp_path / "run")
        try:
            u = next(iter(update_schedule(trainer.train_data, trainer.t)))
            batches = [trainer.train_data.get_batch(idx) for idx in u.batches]
            with SyncCounter() as syncs:
                trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
            assert syncs.total == 1 and sum(syncs.collectives.values()) == 1, (syncs.summary(), syncs.collectives)
        finally:
            trainer.close()
    finally:
        dist.destroy_process_group()


def test_label_positions_make_the_loss_sync_free_and_equal_the_mask():
    model = tiny_model(VOCAB).train()
    pairs = [([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11]), ([9, 9, 9, 9, 4], [7])]
    batch = collate(pairs)
    flat_mask = batch.tgt_out.reshape(-1).ne(PAD_ID).nonzero().squeeze(1)
    assert batch.labels is not None
    assert torch.equal(batch.labels, flat_mask) and batch.ntokens == batch.labels.numel() == 2 + 4 + 1 + 3
    assert (
        batch.src_padded and not collate([([5, 6], [7]), ([8, 9], [4, 4])]).src_padded
    )  # sources of one length: no mask needed
    objective = TeacherForcedLoss(model, label_smoothing=0.1)
    with SyncCounter() as syncs:
        torch.manual_seed(0)
        loss, nll, n = objective(batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded)
        loss.backward()
    assert syncs.total == 0, syncs.summary()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SyncCounter() as syncs:  # without the positions the loss finds them itself: a nonzero
        torch.manual_seed(0)
        loss2, nll2, n2 = objective(batch.src, batch.tgt_in, batch.tgt_out)
        loss2.backward()
    assert syncs.counts == {"nonzero": 1}
    assert n == n2 == batch.ntokens and torch.equal(loss, loss2) and torch.equal(nll, nll2)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


# ---------------------------------------------------------------- search
def _sources(n: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (n,), generator=g).tolist()
    out = torch.full((n, max(lengths) + 1), PAD_ID)
    for i, m in enumerate(lengths):
        out[i, :m] = torch.randint(4, VOCAB, (m,), generator=g)
        out[i, m] = EOS_ID
    return out


@pytest.mark.parametrize("batch", [4, 24])
@pytest.mark.parametrize("beam", [1, 2, 5])
def test_search_syncs_once_per_step_whatever_the_batch_and_beam(batch, beam):
    model = tiny_model(VOCAB, seed=2)
    src = _sources(batch)

    def run() -> list:
        if beam == 1:
            return greedy_search(model, src, max_len_a=1.0, max_len_b=6)
        return beam_search(model, src, beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=6, nbest=beam)

    result, syncs, per_step = per_call(model, "decode_step", run)
    assert len(per_step) > 3 and len(result) == batch
    assert per_step[:-1] == [1] * (len(per_step) - 1), syncs.summary()  # the rows still running: one read
    assert per_step[-1] <= 3, syncs.summary()  # the last step's read, then the results read once
    assert syncs.total <= len(per_step) + 3  # + the longest output length, read before the first step
    assert result == run()  # counting changes nothing


def test_ensemble_search_keeps_the_budget():
    ensemble = Ensemble([tiny_model(VOCAB, seed=2), tiny_model(VOCAB, seed=5)]).eval()
    _, syncs, per_step = per_call(
        ensemble, "decode_step", lambda: beam_search(ensemble, _sources(12), beam=3, max_len_b=6)
    )
    assert per_step[:-1] == [1] * (len(per_step) - 1), syncs.summary()


def test_a_tie_at_the_beam_cut_off_costs_one_more_sync():
    """Logits rounded to integers tie everywhere: the steps whose top-2k cut-off falls among equal scores
    settle it by index, at one more read; the results equal those of the exact settling every step."""

    class Rounded(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.training, self.specials = inner, False, inner.specials

        def encode(self, src):
            return self.inner.encode(src)

        def init_cache(self, enc):
            return self.inner.init_cache(enc)

        def decode_step(self, tokens, cache):
            return torch.round(self.inner.decode_step(tokens, cache))

        def max_output_length(self):
            return None

    model = Rounded(tiny_model(VOCAB, seed=1)).eval()
    _, syncs, per_step = per_call(model, "decode_step", lambda: beam_search(model, _sources(6), beam=3, max_len_b=5))
    assert max(per_step[:-1]) == 2 and min(per_step[:-1]) >= 1, per_step


# ---------------------------------------------------------------- the log
def test_the_log_reads_the_device_sums_once_per_window_and_counts_training_time_only(monkeypatch):
    from transformer_mt.training import runlog

    class Clock:  # the window's clock, moved by hand
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            return cls.now

    monkeypatch.setattr(runlog, "time", Clock)
    window = runlog.Window()
    for _ in range(2):  # two updates of 10 tokens, loss and nll left on the device as the trainer leaves them
        window.add(
            UpdateStats(
                loss=torch.tensor(30.0, dtype=torch.float64),
                nll=torch.tensor(20.0, dtype=torch.float64),
                tokens=10,
                lr=1e-3,
                gnorm=1.5,
                seconds=0.0,
            )
        )
    Clock.now = 4.0
    with window.paused():  # a validation and its checkpoint: 6 s
        Clock.now = 10.0
    Clock.now = 12.0
    with SyncCounter() as syncs:
        rec = window.flush()
    assert syncs.counts == {"item": 2}  # loss and nll, once per window
    assert rec["loss"] == 3.0 and rec["nll"] == 2.0 and rec["tokens"] == 20
    assert (
        rec["tokens_per_s"] == 20 / 6.0 and rec["updates_per_s"] == 2 / 6.0
    )  # 12 s of wall clock, 6 of them validating
