"""The CUDA paths. Tests marked ``cuda`` need a CUDA GPU and are skipped without one (conftest);
the rest check on any machine what a CPU can of those paths: the GPU benchmark's plan, ``train.dtype: auto``.

On a GPU host: ``pytest -m cuda tests/runtime/test_cuda.py`` (and the whole suite passes there too: every other test
pins train.device=cpu)."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import run_config, tiny_model, tokens
from transformer_mt import runtime
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import load_config
from transformer_mt.decoding import beam_search, greedy_search
from transformer_mt.runtime import SyncCounter, per_call
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.training import Trainer, resumed_config, set_up, target_tokens, train, update_schedule

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=64",
    "model.heads=4",
    "model.d_ff=128",
    "train.max_tokens=400",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.003",
    "train.warmup_updates=5",
    "train.log_every=5",
    "train.threads=1",
    "data.valid_src=",
    "data.valid_tgt=",
]


def gpu_config(files, spm_model, out, *extra: str):
    return run_config(files, spm_model, out, *TINY, "train.device=cuda", *extra)


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_script_cuda", REPO / "scripts" / "benchmark.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- what a CPU can check
def test_benchmark_cuda_plan(tmp_path):
    """--device cuda --dry-run: the phases a GPU run takes, built without a GPU: the paper's base and big at
    25k-token batches and the recipe, each in bf16 and fp32 (TF32), compiled base and big with --compile,
    greedy and beam-5 translation and the sync counts, all on cuda; the matmul peak at the GPU's size."""
    bench = load_benchmark()
    args = bench.parse_args(["--device", "cuda", "--dry-run", "--compile", "--out", str(tmp_path)])
    plan = bench.dry_run(args)
    kinds = [p["kind"] for p in plan]
    assert kinds[0] == kinds[-1] == "matmul" and plan[0]["device"] == "cuda" and plan[0]["n"] == 8192
    trains = {p["name"]: p for p in plan if p["kind"] == "train"}
    assert set(trains) == {f"train-{m}-{d}" for m in ("base", "big", "recipe") for d in ("bfloat16", "float32")} | {
        "train-base-bfloat16-compiled",
        "train-big-bfloat16-compiled",
    }
    recipe = load_config(REPO / "configs" / "multi30k_en_de.yaml", check_files=False)
    for name, spec in trains.items():
        t, m = spec["config"]["train"], spec["config"]["model"]
        assert (
            t["device"] == "cuda" and t["dtype"] == name.split("-")[2] and spec["compile"] == name.endswith("compiled")
        )
        assert spec["flop_batches"] == 0  # FLOPs by the formula on a GPU
        if name.startswith(("train-base", "train-big")):
            assert t["max_tokens"] == 25000 and t["update_freq"] == 1
            assert (m["d_model"], m["d_ff"], m["heads"], m["encoder_layers"]) == (
                (512, 2048, 8, 6) if "base" in name else (1024, 4096, 16, 6)
            )
        else:
            assert t["max_tokens"] == recipe.train.max_tokens and m["d_model"] == recipe.model.d_model
    translations = [(p["search"], p["dtype"], p["device"]) for p in plan if p["kind"] == "translate"]
    assert translations == [("greedy", "float32", "cuda"), ("beam5", "float32", "cuda"), ("beam5", "bfloat16", "cuda")]
    syncs = [p for p in plan if p["kind"] == "syncs"]
    assert len(syncs) == 1 and syncs[0]["config"]["train"]["device"] == "cuda"
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):  # no dry run, no GPU: refused up front, before any data is prepared
            bench.parse_args(["--device", "cuda", "--out", str(tmp_path)])


def test_gpu_peak_table_prefers_the_specific_name():
    bench = load_benchmark()
    assert bench.gpu_bf16_peak("NVIDIA H100 PCIe", 1.0)[0] == 756e12
    assert bench.gpu_bf16_peak("NVIDIA H100 80GB HBM3", 1.0)[0] == 989.5e12
    assert bench.gpu_bf16_peak("NVIDIA L40S", 1.0)[0] == 362e12 and bench.gpu_bf16_peak("NVIDIA L4", 1.0)[0] == 121e12
    assert bench.gpu_bf16_peak("Some Future GPU", 123.0) == (
        123e9,
        "measured bf16 matmul peak (GPU not in the datasheet table)",
    )
    assert bench.gpu_bf16_peak("NVIDIA A100-SXM4-80GB", 1.0, 400.0)[0] == 400e12  # --peak-tflops wins


def test_auto_dtype_rule(monkeypatch):
    """train.dtype auto: bfloat16 on a CPU only for a model at least 256 wide on a CPU whose bf16 matmul peak is
    at least twice its float32 one (AMX); a narrower model never measures; float32 on MPS."""
    from transformer_mt.runtime import flops

    def no_measurement(*_a, **_k):
        raise AssertionError("a narrow model must not measure")

    monkeypatch.setattr(flops, "cached_peak", no_measurement)
    assert runtime.auto_dtype(torch.device("cpu"), d_model=128) == "float32"
    assert runtime.auto_dtype(torch.device("mps"), d_model=1024) == "float32"
    for bf16, want in ((3.0e12, "bfloat16"), (1.9e12, "float32"), (0.5e12, "float32")):  # float32 peak 1e12
        monkeypatch.setattr(
            flops, "cached_peak", lambda dtype, _bf16=bf16, **_kw: _bf16 if dtype == "bfloat16" else 1.0e12
        )
        assert runtime.auto_dtype(torch.device("cpu"), d_model=512) == want
        assert runtime.auto_dtype(torch.device("cpu"), d_model=256) == want


def test_train_dtype_auto_is_resolved_per_machine_and_saved_as_auto(pairs64, spm_model, tmp_path):
    cfg = run_config(pairs64, spm_model, tmp_path / "run", *TINY, "train.dtype=auto", "train.max_updates=2")
    trainer = Trainer(set_up(cfg, resume=False))
    try:
        want = runtime.auto_dtype(trainer.device, d_model=64)  # 64 wide: float32 on any CPU, bf16 on a bf16 GPU
        assert trainer.t.dtype == want and cfg.train.dtype == "auto"
    finally:
        trainer.close()
    train(cfg)
    assert load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["config"]["train"]["dtype"] == "auto"
    assert "dtype: auto" in (tmp_path / "run" / "config.yaml").read_text()


# ---------------------------------------------------------------- on a GPU
@pytest.mark.cuda
def test_cuda_device_is_made_current_and_float32_matmuls_use_tf32():
    device = runtime.pick_device(f"cuda:{torch.cuda.device_count() - 1}")
    assert torch.cuda.current_device() == device.index
    matmul = torch.backends.cuda.matmul
    assert (matmul.fp32_precision == "tf32") if hasattr(matmul, "fp32_precision") else matmul.allow_tf32


@pytest.mark.cuda
@pytest.mark.parametrize("weights", ["cast", "autocast"])
def test_cached_decoding_equals_the_full_forward_in_bfloat16(weights):
    model = tiny_model(norm="pre").cuda()
    model.reserve_positions(16)
    src = tokens([6, 3], seed=5).cuda()
    if weights == "cast":
        model.cast_weights(torch.bfloat16)
    ctx = (
        torch.autocast("cuda", dtype=torch.bfloat16) if weights == "autocast" else torch.autocast("cuda", enabled=False)
    )
    g = torch.Generator().manual_seed(6)
    hist = torch.full((2, 1), BOS_ID, device="cuda")
    with torch.inference_mode(), ctx:
        cache = model.init_cache(model.encode(src))
        for _ in range(10):
            step = model.decode_step(hist[:, -1], cache).float()
            full = model(src, hist)[:, -1].float()
            torch.testing.assert_close(step, full, rtol=0.02, atol=0.05)  # bf16: two summation orders of the same terms
            hist = torch.cat([hist, torch.randint(4, 40, (2, 1), generator=g).cuda()], dim=1)


@pytest.mark.cuda
def test_bfloat16_training_loss_falls(pairs64, spm_model, tmp_path):
    losses = []
    train(
        gpu_config(pairs64, spm_model, tmp_path / "run", "train.dtype=bfloat16", "train.max_updates=40"),
        on_update=lambda _u, s: losses.append(float(s.loss) / s.tokens),
    )
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.cuda
def test_resume_on_cuda_is_exact(pairs64, spm_model, tmp_path):
    """Dropout on (CUDA generator states in the checkpoint): 4 + 4 updates == 8 updates, bit for bit."""
    extra = ("model.dropout=0.1", "train.save_every=4", "train.validate_every=1000")
    straight = []
    train(
        gpu_config(pairs64, spm_model, tmp_path / "a", *extra, "train.max_updates=8"),
        on_update=lambda _u, s: straight.append(float(s.loss)),
    )
    first, second = [], []
    train(
        gpu_config(pairs64, spm_model, tmp_path / "b", *extra, "train.max_updates=4"),
        on_update=lambda _u, s: first.append(float(s.loss)),
    )
    train(
        resumed_config(tmp_path / "b", ["train.max_updates=8"]),
        resume=True,
        on_update=lambda _u, s: second.append(float(s.loss)),
    )
    assert first + second == straight
    a, b = (load_checkpoint(tmp_path / d / "checkpoint_last.pt")["model"] for d in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.cuda
def test_float16_with_loss_scaling_trains_and_an_overflow_skips_the_schedule(pairs64, spm_model, tmp_path):
    cfg = gpu_config(pairs64, spm_model, tmp_path / "run", "train.dtype=float16", "train.max_updates=30")
    trainer = Trainer(set_up(cfg, resume=False))
    try:
        assert trainer.scaler is not None
        schedule = iter(update_schedule(trainer.train_data, trainer.t))
        u = next(schedule)
        trainer.scaler.scale(torch.ones((), device="cuda"))  # GradScaler makes its scale tensor at the first scale()
        trainer.scaler.update(2.0**40)  # certain to overflow fp16 gradients: the update is skipped, the scale lowered
        stats = trainer.update(
            [trainer.train_data.get_batch(i) for i in u.batches], ntokens=target_tokens(trainer.train_data, u.batches)
        )
        assert (
            not math.isfinite(stats.gnorm)
            and trainer.scheduler.num_updates == 0
            and trainer.scaler.get_scale() < 2.0**40
        )
        trainer.scaler.update(2.0**16)  # back to GradScaler's default start: each overflow only halves the scale
        losses = []
        for u in schedule:
            batches = [trainer.train_data.get_batch(i) for i in u.batches]
            stats = trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
            losses.append(float(stats.loss) / stats.tokens)
            if len(losses) == 30:
                break
        assert trainer.scheduler.num_updates >= 20  # a few early overflows at most
        assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    finally:
        trainer.close()


@pytest.mark.cuda
@pytest.mark.parametrize("beam", [1, 4])
def test_batched_decoding_equals_one_sentence_at_a_time_on_cuda(beam, monkeypatch):
    # Full float32 products: a CUDA Trainer or translator earlier in the process allows TF32 (10-bit mantissa), whose
    # rounding differs between a batch and one sentence by more than the score tolerance below.
    monkeypatch.setattr(torch.backends.cuda.matmul, "fp32_precision", "ieee")
    model = tiny_model(seed=3).cuda()
    g = torch.Generator().manual_seed(9)
    lengths = [7, 2, 9, 4, 5, 3]
    src = torch.full((len(lengths), max(lengths) + 1), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n], src[i, n] = torch.randint(4, 40, (n,), generator=g), EOS_ID
    src = src.cuda()

    def run(batch):
        if beam == 1:
            return [[h] for h in greedy_search(model, batch, max_len_b=6)]
        return beam_search(model, batch, beam=beam, lenpen=0.6, max_len_b=6, nbest=2)

    together = run(src)
    for i, n in enumerate(lengths):
        alone = run(src[i : i + 1, : n + 1])[0]
        assert [h.tokens for h in together[i]] == [h.tokens for h in alone]
        assert [h.score for h in together[i]] == pytest.approx([h.score for h in alone], abs=1e-3)


@pytest.mark.cuda
def test_sync_budgets_hold_on_a_gpu(pairs64, spm_model, tmp_path):
    """On a real GPU the copies count too: batches move from pinned memory without a stream sync."""
    trainer = Trainer(set_up(gpu_config(pairs64, spm_model, tmp_path / "run"), resume=False))
    try:
        for u in itertools.islice(
            update_schedule(trainer.train_data, trainer.t), 3
        ):  # the schedule runs on with no max_updates
            batches = [trainer.train_data.get_batch(i) for i in u.batches]
            with SyncCounter() as syncs:
                trainer.update(batches, ntokens=target_tokens(trainer.train_data, u.batches))
            assert syncs.total == 1, syncs.summary()
        model = trainer.model.eval()
        src = tokens([6, 3, 8, 5], seed=2).cuda()
        src[torch.arange(4), torch.tensor([5, 2, 7, 4])] = EOS_ID
        model.reserve_positions(64)
        _, syncs, per_step = per_call(model, "decode_step", lambda: beam_search(model, src, beam=4, max_len_b=8))
        assert max(per_step[:-1]) <= 1, (
            syncs.summary()
        )  # the budget: at most one sync a step, whatever the batch and beam
    finally:
        trainer.close()


@pytest.mark.cuda
def test_ddp_at_world_size_one_with_nccl():
    """The loss module under DistributedDataParallel (NCCL, one rank) gives the unwrapped module's gradients,
    with the label positions and the source flag passed through; the stats all-reduce runs on the GPU."""
    import torch.distributed as dist

    from transformer_mt.data import collate
    from transformer_mt.model import TeacherForcedLoss

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        device = runtime.pick_device("cuda")
        model = tiny_model().to(device).train()
        objective = TeacherForcedLoss(model, label_smoothing=0.1)
        ddp = runtime.wrap_ddp(objective, device)
        batch = collate([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])]).to(device, non_blocking=True)
        grads = []
        for module in (objective, ddp):
            model.zero_grad()
            loss, _, n = module(batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        assert n == batch.ntokens
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads))
        sums = torch.tensor([1.5, 2.5], dtype=torch.float64, device=device)
        assert runtime.all_reduce_sum_(sums).tolist() == [1.5, 2.5]
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
def test_attention_on_a_gpu_never_runs_cudnn_attention():
    """bfloat16 attention trains and decodes through flash / memory-efficient attention, not cuDNN's (which builds a
    plan for every new shape): no cuDNN attention kernel runs over batches of three lengths, forward and backward."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_model(seed=3).cuda().train()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.autocast("cuda", dtype=torch.bfloat16):
        for n in (5, 9, 13):
            src, tgt = tokens([n, n - 2], seed=n).cuda(), tokens([n + 1, n], seed=n + 1).cuda()
            model(src, tgt).float().sum().backward()
    names = [e.key for e in prof.key_averages()]
    assert any("attention" in name.lower() or "fmha" in name.lower() or "flash" in name.lower() for name in names), (
        names
    )
    assert not any(
        "cudnn" in name.lower() and ("sdpa" in name.lower() or "attention" in name.lower()) for name in names
    ), names
