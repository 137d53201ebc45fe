"""Compilation in a training run (train.compile, train.pad_to_multiple): padded batches leave the loss unchanged,
a run compiled with aot_eager trains the numbers an eager run trains and logs what it compiled, and the defaults on
a CPU neither compile nor pad."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from tests.conftest import run_config
from transformer_mt.config import DataConfig
from transformer_mt.data import load_parallel
from transformer_mt.model import TeacherForcedLoss
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.runtime import dist_info
from transformer_mt.text import Tokenizer
from transformer_mt.training import train
from transformer_mt.training.setup import process

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["model.encoder_layers=2", "model.decoder_layers=2", "model.d_model=32", "model.heads=4", "model.d_ff=64"]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def test_padding_to_a_multiple_leaves_the_loss_and_gradients_unchanged(corpus_slice, spm_model, tmp_path):
    """The extra positions are padding like any other: masked as keys, never a label."""
    from tests.conftest import tiny_model

    tok = Tokenizer(spm_model)
    data = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    idx = data.batches(1, max_tokens=500, seed=4)[0]
    model = tiny_model(tok.vocab_size, max_positions=128).use_ops(ReferenceOps()).train()
    results = {}
    for multiple in (1, 8, 16):
        batch = data.get_batch(idx, pad_to_multiple=multiple)
        assert batch.src.size(1) % multiple == 0 and batch.tgt_in.size(1) % multiple == 0
        assert batch.tgt_out.reshape(-1)[batch.labels].tolist() == [
            t for i in idx for t in [*data.pair(int(i))[1].tolist(), tok.specials.eos]
        ]  # the same labels, in order
        model.zero_grad(set_to_none=True)
        loss, nll, n = TeacherForcedLoss(model, label_smoothing=0.1)(
            batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded
        )
        loss.backward()
        results[multiple] = [loss.detach(), nll, *(p.grad.clone() for p in model.parameters() if p.grad is not None)]
        assert n == batch.ntokens
    assert data.get_batch(idx, pad_to_multiple=16).src.size(1) > data.get_batch(idx).src.size(1)  # padding was added
    for multiple in (8, 16):
        for got, want in zip(results[multiple], results[1]):  # float32 sums over more (zero) terms
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(float(want.abs().max()), 1.0))


def test_the_defaults_on_a_cpu_neither_compile_nor_pad(pairs64, spm_model, tmp_path):
    """train.compile auto and train.pad_to_multiple 0 on a CPU (the cpu backend): off and 1, so a default run trains
    exactly as before; with the reference ops compiled, auto padding is 8."""
    cfg = run_config(pairs64, spm_model, tmp_path / "run", *TINY)
    t, device, _ = process(cfg, dist_info())
    assert (t.compile, t.pad_to_multiple, device.type) == ("off", 1, "cpu")
    cfg = replace(cfg, train=replace(cfg.train, ops="reference", compile="aot_eager"))
    t, _, _ = process(cfg, dist_info())
    assert (t.compile, t.pad_to_multiple) == ("aot_eager", 8)


def _losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and r.get("split", "train") == "train"]


@pytest.mark.slow  # two tiny training runs
def test_a_compiled_run_trains_the_eager_runs_numbers_and_logs_its_graphs(pairs64, spm_model, tmp_path):
    common = [
        *TINY,
        "model.dropout=0.0",
        "model.max_positions=128",
        "data.max_len=100",
        "train.ops=reference",
        "train.threads=1",
        "train.max_updates=6",
        "train.max_tokens=600",
        "train.log_every=1",
        "train.validate_every=6",
        "train.valid_bleu_sentences=2",
    ]
    eager = train(run_config(pairs64, spm_model, tmp_path / "eager", *common, "train.compile=off"))
    compiled = train(run_config(pairs64, spm_model, tmp_path / "compiled", *common, "train.compile=aot_eager"))
    assert eager.progress.update == compiled.progress.update == 6
    want, got = _losses(tmp_path / "eager"), _losses(tmp_path / "compiled")
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):  # padded to 8 and traced: the same sums in another order at most
        assert g == pytest.approx(w, rel=1e-4)
    log = (tmp_path / "compiled" / "train.log").read_text()
    assert "torch.compile (aot_eager): 4 layers of the reference backend, compiled on first use" in log
    assert "sequences padded to a multiple of 8" in log
    # at the end: one graph per layer kind for training, and at most two more (validation's loss in eval mode, and
    # the greedy search's encoder under inference mode); no graph break, no region at its limit
    summary = next(line for line in log.splitlines() if "torch.compile (aot_eager, dynamic=True" in line)
    assert "0 graph breaks" in summary and "recompile limit" not in summary
    for region in ("encoder layer x2", "decoder layer x2"):
        graphs = int(summary.split(region + ": ")[1].split(" graph")[0])
        assert 1 <= graphs <= 3, summary
    assert "torch.compile" not in (tmp_path / "eager" / "train.log").read_text()
