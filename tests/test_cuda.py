"""The CUDA paths (issue 21). Tests marked ``cuda`` need a CUDA GPU and are skipped without one (conftest);
the rest check on any machine what a CPU can of those paths: the GPU benchmark's plan, ``train.dtype: auto``.

On a GPU host: ``pytest -m cuda tests/test_cuda.py`` (and the whole suite passes there too: every other test
pins train.device=cpu)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import run_config
from transformer_mt import runtime
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import load_config
from transformer_mt.train import Trainer, train

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=64", "model.heads=4", "model.d_ff=128", "train.max_tokens=400",
        "train.lr_schedule=inverse_sqrt", "train.lr=0.003", "train.warmup_updates=5", "train.log_every=5", "train.threads=1",
        "data.valid_src=", "data.valid_tgt="]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_script_cuda", REPO / "scripts" / "benchmark.py")
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
    assert set(trains) == {f"train-{m}-{d}" for m in ("base", "big", "recipe") for d in ("bfloat16", "float32")} | \
        {"train-base-bfloat16-compiled", "train-big-bfloat16-compiled"}
    recipe = load_config(REPO / "configs" / "multi30k_en_de.yaml", check_files=False)
    for name, spec in trains.items():
        t, m = spec["config"]["train"], spec["config"]["model"]
        assert t["device"] == "cuda" and t["dtype"] == name.split("-")[2] and spec["compile"] == name.endswith("compiled")
        assert spec["flop_batches"] == 0  # FLOPs by the formula on a GPU
        if name.startswith(("train-base", "train-big")):
            assert t["max_tokens"] == 25000 and t["update_freq"] == 1
            assert (m["d_model"], m["d_ff"], m["heads"], m["encoder_layers"]) == ((512, 2048, 8, 6) if "base" in name else (1024, 4096, 16, 6))
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
    assert bench.gpu_bf16_peak("Some Future GPU", 123.0) == (123e9, "measured bf16 matmul peak (GPU not in the datasheet table)")
    assert bench.gpu_bf16_peak("NVIDIA A100-SXM4-80GB", 1.0, 400.0)[0] == 400e12  # --peak-tflops wins


def test_auto_dtype_rule(monkeypatch):
    """train.dtype auto: bfloat16 on a CPU only for a model at least 512 wide on a CPU whose bf16 matmul peak is
    at least twice its float32 one (AMX); a narrower model never measures; float32 on MPS."""
    from transformer_mt import flops

    def no_measurement(*_a, **_k):
        raise AssertionError("a narrow model must not measure")

    monkeypatch.setattr(flops, "cached_peak", no_measurement)
    assert runtime.auto_dtype(torch.device("cpu"), d_model=128) == "float32"
    assert runtime.auto_dtype(torch.device("mps"), d_model=1024) == "float32"
    for bf16, want in ((3.0e12, "bfloat16"), (1.9e12, "float32"), (0.5e12, "float32")):  # float32 peak 1e12
        monkeypatch.setattr(flops, "cached_peak", lambda dtype, _bf16=bf16, **_kw: _bf16 if dtype == "bfloat16" else 1.0e12)
        assert runtime.auto_dtype(torch.device("cpu"), d_model=512) == want


def test_train_dtype_auto_is_resolved_per_machine_and_saved_as_auto(pairs64, spm_model, tmp_path):
    cfg = run_config(pairs64, spm_model, tmp_path / "run", *TINY, "train.dtype=auto", "train.max_updates=2")
    trainer = Trainer(cfg, resume=False)
    try:
        want = runtime.auto_dtype(trainer.device, d_model=64)  # 64 wide: float32 on any CPU, bf16 on a bf16 GPU
        assert trainer.t.dtype == want and cfg.train.dtype == "auto"
    finally:
        trainer.close()
    train(cfg)
    assert load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["config"]["train"]["dtype"] == "auto"
    assert "dtype: auto" in (tmp_path / "run" / "config.yaml").read_text()
