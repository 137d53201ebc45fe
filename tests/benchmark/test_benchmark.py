"""transformer_mt.benchmark and scripts/benchmark.py: the quick mode runs end to end on real Multi30k and writes the
documented JSON and markdown; the module and the script are one command; the analytic FLOP formula agrees with
torch's FlopCounterMode. No test asserts a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from transformer_mt.benchmark import count_flops, train_step_flops
from transformer_mt.config import ModelConfig
from transformer_mt.model import Transformer
from transformer_mt.runtime import forward_flops
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "benchmark.py"
COLUMNS = [
    "phase",
    "model",
    "dtype",
    "tokens/s",
    "updates/s",
    "sentences/s",
    "GFLOP/s",
    "% of peak",
    "peak RSS MiB",
    "vs quoted reference",
]


@pytest.fixture(scope="module")
def quick_run(multi30k, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--data", str(multi30k), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def test_quick_json_schema(quick_run):
    r = json.loads((quick_run / "benchmark.json").read_text(encoding="utf-8"))
    assert r["schema"] == "transformer_mt.benchmark/1" and r["quick"] is True and r["threads"] == 2
    assert {"date", "machine", "settings", "loadavg_start", "loadavg_end", "quoted_reference"} <= r.keys()
    assert {"cpu", "logical_cpus", "platform", "python", "torch", "cpu_capability"} <= r["machine"].keys()
    assert r["settings"]["warmup_updates"] == 1 and r["settings"]["timed_updates"] == 2

    mm = r["matmul_peak"]
    assert mm["n"] == 256 and positive(mm["peak_rss_mib"])
    for dtype in ("float32", "bfloat16"):
        assert (
            positive(mm[dtype]["gflops"])
            and positive(mm[dtype]["gflops_median"])
            and positive(mm[dtype]["seconds_best"])
        )
        assert mm[dtype]["gflops"] == max(mm[dtype]["gflops_start"], mm[dtype]["gflops_end"])

    rows = {(t["model"], t["dtype"]): t for t in r["training"] if t["ops"] == "fast"}
    assert set(rows) == {(m, d) for m in ("reference", "recipe") for d in ("float32", "bfloat16")}
    plain = {t["model"]: t for t in r["training"] if t["ops"] == "plain"}
    assert set(plain) == {"reference", "recipe"} and len(r["training"]) == 6
    for model, t in plain.items():
        assert t["dtype"] == "float32" and t["vs_quoted"] is None and t["speedup_vs_plain_ops"] is None
        assert t["target_tokens"] == rows[model, "float32"]["target_tokens"]  # the same batches
        assert rows[model, "float32"]["speedup_vs_plain_ops"] == pytest.approx(
            rows[model, "float32"]["tokens_per_s"] / t["tokens_per_s"]
        )
    for (model, dtype), t in rows.items():
        for key in (
            "parameters",
            "seconds",
            "target_tokens",
            "source_tokens",
            "sentences",
            "tokens_per_s",
            "updates_per_s",
            "flops_per_token",
            "flops_per_token_analytic",
            "gflops",
            "fraction_of_peak",
            "peak_rss_mib",
            "avg_tgt_len",
        ):
            assert positive(t[key]), (model, dtype, key, t[key])
        assert t["timed_updates"] == 2 and t["warmup_updates"] == 1 and t["max_tokens"] == 512
        assert t["tokens_per_s"] == pytest.approx(t["target_tokens"] / t["seconds"])
        assert t["updates_per_s"] == pytest.approx(2 / t["seconds"])
        assert t["fraction_of_peak"] == pytest.approx(
            t["flops_per_token"] * t["tokens_per_s"] / 1e9 / mm[dtype]["gflops"]
        )
        # measured (one batch) and analytic (both timed batches) per-token counts describe the same model
        assert t["flops_per_token"] == pytest.approx(t["flops_per_token_analytic"], rel=0.15)
        assert t["model_config"]["d_model"] == 32
        if model == "reference":
            assert t["vs_quoted"]["quoted"] == 1570 and t["vs_quoted"]["target_ratio"] == 1.5
            assert t["vs_quoted"]["ratio"] == pytest.approx(t["tokens_per_s"] / 1570)
        else:
            assert t["vs_quoted"] is None
    assert (
        rows["reference", "float32"]["target_tokens"] == rows["reference", "bfloat16"]["target_tokens"]
    )  # same batches

    searches = {t["search"]: t for t in r["translation"]}
    assert set(searches) == {"greedy", "beam5"} and searches["beam5"]["beam"] == 5 and searches["greedy"]["beam"] == 1
    assert all(t["model"] == "reference" for t in r["translation"])  # no --checkpoint: no recipe rows
    for t in searches.values():
        assert t["sentences"] == 20 and t["representative"] is False
        for key in ("seconds", "sentences_per_s", "tokens_per_s", "target_tokens", "peak_rss_mib", "batch_tokens"):
            assert positive(t[key]), (t["search"], key)
    assert searches["beam5"]["vs_quoted"]["quoted"] == 20 and searches["greedy"]["vs_quoted"] is None
    assert not (quick_run / "runs" / "train-reference-bfloat16").exists()  # only the translated checkpoint is kept


def test_quick_markdown_table(quick_run):
    text = (quick_run / "benchmark.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| phase"))
    assert [c.strip() for c in lines[header].strip("|").split("|")] == COLUMNS
    rows = [line for line in lines[header + 2 :] if line.startswith("|")]
    assert (
        len(rows) == 2 + 6 + 2
    )  # matmul x 2 dtypes, train x 2 models x (2 dtypes + plain ops), translate x 2 searches
    assert all(len(row.strip("|").split("|")) == len(COLUMNS) for row in rows)
    assert "quoted, measured elsewhere" in text and "not representative" in text
    share = next(line for line in lines if line.startswith("Training update, share of the fp32 matmul peak"))
    assert "recipe " in share and "(target 65%)" in share and "reference " in share and "(target 75%)" in share


@pytest.mark.slow
def test_module_and_script_are_one_command(tmp_path):
    """`python -m transformer_mt.benchmark` is the command scripts/benchmark.py runs: the same options (only the
    program's name in the usage line differs) and the same plan of phases."""

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    def options(help_text: str) -> str:
        return help_text.split("\noptions:\n", 1)[1]

    module, script = ("-m", "transformer_mt.benchmark"), (str(SCRIPT),)
    helps = [run(*cmd, "--help") for cmd in (module, script)]
    assert [h.returncode for h in helps] == [0, 0], helps[0].stderr[-2000:] + helps[1].stderr[-2000:]
    assert helps[0].stdout.startswith("usage: python -m transformer_mt.benchmark [-h] [--config CONFIG]")
    assert helps[1].stdout.startswith("usage: benchmark.py [-h] [--config CONFIG]")
    assert options(helps[0].stdout) == options(helps[1].stdout)
    assert "--peer-updates FIRST LAST" in options(helps[0].stdout) and "--phase" not in helps[0].stdout
    plan = ("--device", "cuda", "--dry-run", "--out", str(tmp_path / "out"))
    plans = [run(*cmd, *plan) for cmd in (module, script)]
    assert [p.returncode for p in plans] == [0, 0], plans[0].stderr[-2000:] + plans[1].stderr[-2000:]
    phases = json.loads(plans[0].stdout)
    assert plans[0].stdout == plans[1].stdout and phases[0]["kind"] == phases[-1]["kind"] == "matmul"
    assert not (tmp_path / "out").exists()  # a dry run prepares nothing


def test_analytic_flops_match_flop_counter():
    """The docstring's formula, from first principles, against torch's own count of the forward pass
    (general head sizes and padding); training = forward + backward lies between 3x and 3.5x of it
    (the flash-attention backward recomputes Q K^T)."""
    cfg = ModelConfig(
        encoder_layers=2, decoder_layers=3, d_model=24, heads=3, head_dim=6, value_dim=10, d_ff=40, dropout=0.0
    )
    vocab = 50
    model = Transformer(cfg, src_vocab_size=vocab, tgt_vocab_size=vocab)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (3, 7), generator=gen)
    src[1, 5:], src[:, -1] = PAD_ID, EOS_ID
    tgt = torch.randint(4, vocab, (3, 6), generator=gen)
    tgt_in, tgt_out = torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], 1), tgt
    model.eval()
    with torch.no_grad():
        forward = count_flops(lambda: model(src, tgt_in))
    assert forward == forward_flops(cfg, vocab=vocab, batch=3, src_len=7, tgt_len=6)
    model.train()
    train = train_step_flops(
        model, SimpleNamespace(src=src, tgt_in=tgt_in, tgt_out=tgt_out), dtype="float32", epsilon=0.1
    )
    assert 3 * forward <= train <= 3.5 * forward


def test_the_cpp_attention_is_counted_as_the_batched_matmuls_it_replaces(monkeypatch):
    """A training step through tmt's C++ attention (head size 16) counts the FLOPs of the same step spelled out in
    batched matmuls, which FlopCounterMode knows by itself."""
    import transformer_mt.model.ops.cpu.backend as cpu_backend
    from transformer_mt.model.ops.cpu import native

    if not native.available():
        pytest.skip("the C++ kernels could not be built here")
    cfg = ModelConfig(encoder_layers=1, decoder_layers=2, d_model=32, heads=2, d_ff=48, dropout=0.0)
    vocab = 50
    model = Transformer(cfg, src_vocab_size=vocab, tgt_vocab_size=vocab).train()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (3, 9), generator=gen)
    src[1, 6:], src[:, -1] = PAD_ID, EOS_ID
    tgt = torch.randint(4, vocab, (3, 7), generator=gen)
    batch = SimpleNamespace(src=src, tgt_in=torch.cat([torch.full((3, 1), BOS_ID), tgt[:, :-1]], 1), tgt_out=tgt)
    calls = []
    real = cpu_backend.short_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_backend, "short_attention", counted)
    counts = []
    for loaded in (True, False):
        monkeypatch.setattr(native, "_loaded", [loaded])
        counts.append(train_step_flops(model, batch, dtype="float32", epsilon=0.1))
        assert len(calls) == 5  # 1 + 2 x 2 attentions through the kernel, and none more with it off
    assert counts[0] == counts[1] > 0
