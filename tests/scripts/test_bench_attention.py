"""scripts/bench_attention.py: each timed case runs both attention paths on the same inputs and they agree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from transformer_mt.config import ModelConfig
from transformer_mt.model import MultiHeadAttention
from transformer_mt.model.ops.cpu import CpuOps

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_attention.py"
pytestmark = pytest.mark.usefixtures("one_thread")


def load_script():
    spec = importlib.util.spec_from_file_location("bench_attention", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("causal", "padded"), [(False, True), (True, False)])
def test_a_case_times_both_paths_and_they_agree(causal, padded):
    attn = MultiHeadAttention(ModelConfig(d_model=32, heads=4))
    r = load_script().case(attn, batch=6, queries=9, keys=9, causal=causal, padded=padded, reps=1)
    assert r["sdpa"] > 0 and r["spelled"] > 0
    assert r["diff"] < 1e-5  # the same attention through either path
    assert type(attn.ops) is CpuOps  # the script put the module's own backend back
