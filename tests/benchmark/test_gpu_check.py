"""scripts/gpu_check.sh's plan (transformer_mt.benchmark.gpu_check): the phases it runs on a GPU and in what
settings, the table's arithmetic, the time budget and a failing phase, and the loss agreement phase run on a CPU with
the backend's CPU stand-in (compiled with aot_eager, packed batches)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from transformer_mt.benchmark.gpu_check import (
    AGREEMENT_UPDATES,
    BACKEND,
    EAGER,
    gpu_check_plan,
    phase_agreement,
    render_table,
    table_rows,
)
from transformer_mt.benchmark.settings import FULL_CUDA, GPU_BATCH_TOKENS, QUICK
from transformer_mt.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _args(tmp_path: Path, *, device: str = "cuda", quick: bool = False) -> argparse.Namespace:
    return argparse.Namespace(
        device=device, quick=quick, threads=2, out=tmp_path, warmup=8, updates=30, sentences=0, checkpoint=None
    )


def _plan(tmp_path: Path, *, checkpoint: Path | None, device: str = "cuda") -> list[dict]:
    recipe = load_config(REPO / "configs" / "multi30k_small.yaml", check_files=False)
    paths = {name: tmp_path / name for name in ("spm.model", "train.en", "train.de", "test.en")}
    return gpu_check_plan(
        _args(tmp_path, device=device),
        FULL_CUDA,
        recipe,
        spm=paths["spm.model"],
        src=paths["train.en"],
        tgt=paths["train.de"],
        test_src=paths["test.en"],
        checkpoint=checkpoint,
    )


def _train_settings(spec: dict) -> dict:
    t = spec["config"]["train"]
    return {"ops": t["ops"], "compile": t["compile"], "packed": t["packed"]}


def test_the_plan_compares_eager_with_the_cuda_backend(tmp_path: Path) -> None:
    plan = _plan(tmp_path, checkpoint=tmp_path / "recipe.pt")
    names = [s["name"] for s in plan]
    assert names[0] == "matmul" and names[-1] == "matmul-end"
    # the headline rows first, then decoding, the agreement, the recipe, CTranslate2
    headline = ["train-base-bf16-eager", "train-base-bf16-backend", "train-big-bf16-eager", "train-big-bf16-backend"]
    assert names[1:5] == headline
    assert names.index("agreement-base") > names.index("translate-recipe-beam5-graphed")
    trains = {s["name"]: s for s in plan if s["kind"] == "train"}
    assert len(trains) == 8
    assert _train_settings(trains.pop("train-base-bf16-backend-padded")) == {**BACKEND["cuda"], "packed": "off"}
    for name, spec in trains.items():
        expected = EAGER if name.endswith("eager") else BACKEND["cuda"]
        assert _train_settings(spec) == expected, name
        assert spec["config"]["train"]["device"] == "cuda"
        assert spec["config"]["train"]["dtype"] == ("float32" if "tf32" in name else "bfloat16")
    assert EAGER == {"ops": "reference", "compile": "off", "packed": "off"}
    assert BACKEND["cuda"] == {"ops": "cuda", "compile": "auto", "packed": "auto"}
    for model in ("base", "big"):  # the paper's 25k-token batches; the d_model of Table 3's base and big
        spec = trains[f"train-{model}-bf16-backend"]
        assert spec["config"]["train"]["max_tokens"] == GPU_BATCH_TOKENS
        assert spec["config"]["model"]["d_model"] == {"base": 512, "big": 1024}[model]
    decoding = [s for s in plan if s["kind"] in ("translate", "ct2-gpu")]
    assert {(s["search"], s.get("mode", "ct2")) for s in decoding} == {
        (search, mode) for search in ("greedy", "beam5") for mode in ("eager", "graphed", "ct2")
    }
    assert all(s["checkpoint"] == str(tmp_path / "recipe.pt") and s["representative"] for s in decoding)
    agreement = next(s for s in plan if s["kind"] == "agreement")
    assert agreement["updates"] == AGREEMENT_UPDATES == 200 and agreement["backend"] == BACKEND["cuda"]


def test_without_a_checkpoint_the_recipe_trains_before_it_is_decoded(tmp_path: Path) -> None:
    plan = _plan(tmp_path, checkpoint=None)
    names = [s["name"] for s in plan]
    kept = next(s for s in plan if s["name"] == "train-recipe-bf16-backend")
    assert kept["keep_checkpoint"]
    assert names.index("train-recipe-bf16-backend") < names.index("translate-recipe-greedy-eager")
    translate = next(s for s in plan if s["name"] == "translate-recipe-greedy-eager")
    assert translate["checkpoint"].endswith("train-recipe-bf16-backend/checkpoint_last.pt")
    assert not translate["representative"]


def test_on_a_cpu_the_backend_rows_take_its_stand_in(tmp_path: Path) -> None:
    plan = _plan(tmp_path, checkpoint=None, device="cpu")
    backend_rows = [s for s in plan if s["kind"] == "train" and s["name"].endswith("backend")]
    assert backend_rows and all(_train_settings(s) == BACKEND["cpu"] for s in backend_rows)
    assert BACKEND["cpu"]["compile"] == "aot_eager" and BACKEND["cpu"]["packed"] == "on"


def test_table_rows_compute_mfu_by_the_formula() -> None:
    spec = {
        "name": "train-base-bf16-backend",
        "kind": "train",
        "config": {"train": {"dtype": "bfloat16"}},
        "gpu_check": {"backend": "cuda backend"},
    }
    res = {
        "parameters": 60_000_000,
        "tokens_per_s": 500_000.0,
        "gpu_peak_memory_mib": 12_345.6,
        "compiled_graphs": 3,
        "graph_breaks": 0,
        "target_padding_fraction": 0.0,
    }
    (row,) = table_rows([(spec, res)], measured_peak=800e12, datasheet_peak=1000e12)
    # 6 x 60M x 500k = 1.8e14 FLOP/s: 22.5% of 800 TFLOP/s, 18.0% of 1000 TFLOP/s
    assert row[3:9] == ["500,000", "", "22.5", "18.0", "12,346", "3 / 0"]


def test_a_failed_or_skipped_phase_is_a_row_that_says_so() -> None:
    failed = ({"name": "train-big-bf16-backend", "kind": "train"}, {"failed": "exit 1: CUDA out of memory"})
    skipped = ({"name": "ctranslate2-recipe-greedy", "kind": "ct2-gpu"}, {"skipped": "RuntimeError: no libcublas"})
    rows = table_rows([failed, skipped], measured_peak=1.0, datasheet_peak=1.0)
    assert rows[0][-1] == "failed: exit 1: CUDA out of memory"
    assert rows[1][-1] == "skipped: RuntimeError: no libcublas"
    report = {
        "header": {
            "date": "d",
            "gpu": "g",
            "torch": "t",
            "cuda": "c",
            "measured_peak_tflops": 790.0,
            "datasheet_peak_tflops": 989.5,
            "datasheet_source": "s",
            "warmup": 8,
            "updates": 30,
        },
        "rows": rows,
        "cuda_tests": "3 passed in 4.2s",
    }
    text = render_table(report)
    assert text.count("\n| ") == 3  # the header row and two phases (the separator starts with |-)
    assert text.rstrip().endswith("cuda-marked tests: 3 passed in 4.2s")


def test_the_script_is_valid_bash(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_the_agreement_phase_on_a_cpu(corpus_slice, spm_model, tmp_path: Path) -> None:
    """The cuda backend's CPU stand-in (the reference ops compiled with aot_eager, packed batches) trains the same
    losses as the reference backend, update for update, in float32."""
    from tests.conftest import run_config
    from transformer_mt.config import to_dict

    cfg = run_config(
        corpus_slice,
        spm_model,
        tmp_path / "agree",
        *[f"model.{k}={v}" for k, v in dict(QUICK.model).items()],
        "train.max_tokens=512",
        "train.dtype=float32",
        "train.validate_every=1000",
        "data.valid_src=",
        "data.valid_tgt=",
    )
    spec = {"name": "agreement", "config": to_dict(cfg), "backend": BACKEND["cpu"], "updates": 6, "tolerance": 1e-4}
    res = phase_agreement(spec)
    assert res["updates"] == 6 and res["all_finite"]
    assert res["within_tolerance"], res
