"""Regional torch.compile (model/ops/compiling.py): the compiled layer stacks and loss compute what the reference ops
compute, values and gradients; identical layers share one graph; an epoch of real Multi30k batches compiles once per
region and breaks no graph; the recompile limit falls back to eager with one log line.

The compiles use ``aot_eager`` (dynamo's trace and AOTAutograd's forward and backward graphs, run as torch ops):
everything a GPU's inductor compile depends on except the code generation. One test runs inductor's CPU code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.nn.attention import sdpa_kernel

from tests.conftest import tiny_model, tokens
from transformer_mt.config import ConfigError, DataConfig
from transformer_mt.data import ParallelData, load_parallel
from transformer_mt.data.batching import Batch, collate_pairs
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.model.ops.chunked_loss import EAGER
from transformer_mt.model.ops.compiling import (
    Compiler,
    CompileSettings,
    compile_model,
    compile_setting,
    pad_multiple,
)
from transformer_mt.model.ops.cpu import CpuOps
from transformer_mt.model.ops.cuda import CUDA_SDPA_BACKENDS, CudaOps
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.text import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
AOT = CompileSettings(backend="aot_eager")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Dynamo keeps graphs per code object for the whole process: each test starts from none (and leaves none)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.fixture(scope="module")
def m30k(corpus_slice, spm_model, tmp_path_factory) -> ParallelData:
    """The 2000-pair Multi30k slice, encoded with the session's 1000-piece tokenizer."""
    tok = Tokenizer(spm_model)
    cache = tmp_path_factory.mktemp("compile_cache")
    return load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=cache, quiet=True
    )


class PinnedCudaOps(CudaOps):
    """The cuda backend with its GPU attention path on CPU tensors too: SDPA inside ``sdpa_kernel(CUDA_SDPA_BACKENDS)``
    (whose MATH kernel runs on CPU), so that the context manager is traced as on a GPU."""

    def sdpa(self, q, k, v, allowed, *, causal, dropout_p):
        with sdpa_kernel(CUDA_SDPA_BACKENDS):
            return ReferenceOps.sdpa(self, q, k, v, allowed, causal=causal, dropout_p=dropout_p)


def _model(ops, *, layers: int = 2, **changes) -> Transformer:
    """A tiny model for the 1000-piece vocabulary (seed 0: the same weights for every backend), in train mode."""
    m = tiny_model(1000, encoder_layers=layers, decoder_layers=layers, max_positions=128, **changes)
    return m.use_ops(ops).train()


def _step(model: Transformer, batch: Batch) -> dict[str, torch.Tensor]:
    """A training step's loss, nll and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    loss, nll, _ = TeacherForcedLoss(model, label_smoothing=0.1)(
        batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded
    )
    loss.backward()
    out = {"loss": loss.detach(), "nll": nll.detach()}
    out.update({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    return out


def _assert_agree(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        scale = max(float(value.abs().max()), 1.0)  # float32 sums in another order: relative to the tensor's size
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5 * scale, msg=key)


def _graphs(compiler: Compiler) -> dict[str, int]:
    return {name: region.graphs() for name, region in compiler.regions.items()}


@pytest.mark.parametrize("norm", ["post", "scale"])  # scale: ScaleNorm's autograd Function and FixNorm in the graph
def test_compiled_layers_and_loss_equal_the_reference_ops(m30k, norm):
    """A training step of the compiled cuda backend (its GPU attention path pinned as on a GPU: no graph break)
    against the reference ops, uncompiled, on a real batch: loss, nll and every gradient."""
    batch = m30k.get_batch(m30k.batches(1, max_tokens=600, seed=3)[0], pad_to_multiple=8)
    want = _step(_model(ReferenceOps(), layers=3, norm=norm), batch)
    model = _model(PinnedCudaOps(loss_chunk_rows=64), layers=3, norm=norm)  # several chunks of the batch's labels
    compiler = Compiler(AOT)
    compiled = compile_model(model, compiler)
    assert compiled.loss and compiled.ops is model.ops
    assert isinstance(model.ops, PinnedCudaOps) and model.ops.loss_chunk_rows == 64 and model.ops.passes is not EAGER
    got = _step(model, batch)
    _assert_agree(got, want)
    assert batch.ntokens > 64  # the loss ran in chunks
    # three identical layers of each kind: one graph each kind, one for the loss's pass with its gradient (full
    # chunks and the last one: symbolic sizes cover both)
    assert _graphs(compiler) == {"encoder layer": 1, "decoder layer": 1, "loss pass": 0, "loss pass + grad": 1}
    assert compiler.graph_breaks() == 0
    assert [r.callers for r in compiler.regions.values()] == [3, 3, 1, 1]


def _epoch_slice(data: ParallelData, pairs: int = 600) -> tuple[ParallelData, list[np.ndarray]]:
    keep = np.zeros(data.num_pairs, dtype=bool)
    keep[:pairs] = True
    part = data.subset(keep)
    return part, part.batches(1, max_tokens=1500, seed=1)


def test_an_epoch_of_multi30k_batches_compiles_once_per_region_and_breaks_no_graph(m30k):
    """The token-budget batches tmt builds for an epoch (of a 600-pair slice), padded to a multiple of 8: batch sizes
    and both lengths change from batch to batch, and symbolic sizes (dynamic=True) cover them all with one graph
    per region for training, and one more per region for validation (eval mode, no gradient). A batch of one row
    would add one (sizes 1 are specialised): the slice has none."""
    part, batches = _epoch_slice(m30k)
    batches_ = [part.get_batch(idx, pad_to_multiple=8) for idx in batches]
    shapes = {(b.src.shape, b.tgt_in.shape) for b in batches_}
    assert len(batches_) >= 8 and len(shapes) >= 6 and min(b.nsentences for b in batches_) > 1
    model = _model(CudaOps())
    compiler = Compiler(AOT)
    compile_model(model, compiler)
    for batch in batches_:
        _step(model, batch)
    assert _graphs(compiler) == {"encoder layer": 1, "decoder layer": 1, "loss pass": 0, "loss pass + grad": 1}
    model.eval()
    with torch.no_grad():
        for batch in batches_[:4]:
            TeacherForcedLoss(model, label_smoothing=0.1)(batch.src, batch.tgt_in, batch.tgt_out, batch.labels)
    assert _graphs(compiler) == {"encoder layer": 2, "decoder layer": 2, "loss pass": 1, "loss pass + grad": 1}
    assert compiler.graph_breaks() == 0
    assert compiler.at_limit == []
    assert "encoder layer x2: 2 graphs; decoder layer x2: 2 graphs" in compiler.summary()


def test_past_the_recompile_limit_a_region_runs_eagerly_with_one_log_line(m30k):
    """Static shapes (dynamic=False) and a limit of 2 graphs: the third shape of the encoder layer runs eagerly, the
    log gets one line (and torch's own warning is not printed), and the numbers stay the reference's."""
    lines: list[str] = []
    model = _model(CudaOps()).eval()
    compiler = Compiler(CompileSettings(backend="aot_eager", dynamic=False, recompile_limit=2), log=lines.append)
    compile_model(model, compiler)
    reference = _model(ReferenceOps()).eval()
    with torch.no_grad():
        for n in (3, 4, 5, 6, 7):
            src = tokens([n, n - 1], vocab=1000)
            torch.testing.assert_close(model.encode(src).memory, reference.encode(src).memory)
    assert _graphs(compiler)["encoder layer"] == 2
    assert compiler.at_limit == ["encoder layer"]
    assert len(lines) == 1 and lines[0].startswith(
        "torch.compile: encoder layer reached its recompile limit (2 graphs)"
    )
    assert "eager for new shapes: encoder layer" in compiler.summary()


@pytest.mark.slow  # inductor's C++ code generation and build: a minute or more on two cores
def test_inductor_on_cpu_computes_the_reference_numbers(m30k):
    """Inductor's generated code (C++ on CPU, Triton on a GPU) for one training step."""
    batch = m30k.get_batch(m30k.batches(1, max_tokens=300, seed=3)[2], pad_to_multiple=8)
    model = _model(CudaOps(), layers=1)
    compiler = Compiler(CompileSettings(backend="inductor"))
    compile_model(model, compiler)
    _assert_agree(_step(model, batch), _step(_model(ReferenceOps(), layers=1), batch))
    assert compiler.graph_breaks() == 0


def test_the_reference_backend_compiles_its_layers_and_the_cpu_backend_is_refused():
    model = _model(ReferenceOps())
    compiled = compile_model(model, Compiler(AOT))
    assert compiled.layers == ["encoder layer"] * 2 + ["decoder layer"] * 2
    assert type(model.ops) is ReferenceOps  # its loss stays the plain formula
    with pytest.raises(ConfigError, match="cpu backend"):
        compile_model(_model(CpuOps()), Compiler(AOT))


@pytest.mark.parametrize(
    ("setting", "ops", "device", "want"),
    [
        ("auto", "cuda", "cuda", "on"),
        ("auto", "cuda", "cpu", "off"),  # the cuda backend's paths on CPU tensors
        ("auto", "cpu", "cpu", "off"),  # the default on a CPU: nothing compiled
        ("auto", "reference", "cuda", "off"),
        ("on", "reference", "cuda", "on"),
        ("aot_eager", "reference", "cpu", "aot_eager"),
        ("off", "cuda", "cuda", "off"),
    ],
)
def test_train_compile_resolves_per_backend_and_device(setting, ops, device, want):
    assert compile_setting(setting, ops_name=ops, device_type=device) == want


def test_train_compile_refuses_the_cpu_backend_and_unknown_settings():
    with pytest.raises(ConfigError, match="train.compile=on: the cpu backend"):
        compile_setting("on", ops_name="cpu", device_type="cpu")
    with pytest.raises(ConfigError, match="train.compile='x{57}...' is not one of"):
        compile_setting("x" * 500, ops_name="cuda", device_type="cuda")


def test_pad_to_multiple_resolves_and_must_fit_the_positions():
    assert pad_multiple(0, compiling=False, longest=257, max_positions=1024) == 1  # the default: no padding
    assert pad_multiple(0, compiling=True, longest=257, max_positions=1024) == 8
    assert pad_multiple(16, compiling=False, longest=257, max_positions=1024) == 16
    assert pad_multiple(0, compiling=True, longest=257, max_positions=264) == 8  # 257 -> 264 fits exactly
    with pytest.raises(ConfigError, match=r"pads sequences of 257 positions .* to 264, past model.max_positions=260"):
        pad_multiple(0, compiling=True, longest=257, max_positions=260)


def test_unpadded_collation_is_unchanged(m30k):
    """pad_to_multiple 0 and 1 (the default on a CPU) collate exactly as before: to the longest row."""
    idx = m30k.batches(1, max_tokens=600, seed=3)[0]
    before = collate_pairs(m30k, idx)
    for multiple in (0, 1):
        after = collate_pairs(m30k, idx, pad_to_multiple=multiple)
        for field in dataclasses.fields(Batch):
            a, b = getattr(before, field.name), getattr(after, field.name)
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field.name
    assert before.src.size(1) == max(len(m30k.pair(int(i))[0]) for i in idx) + 1  # pieces + EOS


@pytest.mark.cuda
def test_on_a_gpu_an_inductor_epoch_in_bf16_compiles_once_per_region_and_matches_the_reference(m30k):
    """The GPU's case: inductor (Triton kernels), bf16 autocast, the cuda backend's pinned SDPA and compiled loss, over
    the epoch slice; the first batch's step against the reference ops eager in bf16 (the same autocast, rounded in
    other places: loss within 1%, each gradient within 5% relative norm)."""
    part, batches = _epoch_slice(m30k)
    batches_ = [part.get_batch(idx, pad_to_multiple=8).to("cuda") for idx in batches]
    model = _model(CudaOps()).cuda()
    compiler = Compiler(CompileSettings(backend="inductor"))
    compile_model(model, compiler)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = _step(model, batches_[0])
        want = _step(_model(ReferenceOps()).cuda(), batches_[0])
        for batch in batches_[1:]:
            _step(model, batch)
    assert _graphs(compiler) == {"encoder layer": 1, "decoder layer": 1, "loss pass": 0, "loss pass + grad": 1}
    assert compiler.graph_breaks() == 0
    assert float((got["loss"] - want["loss"]).abs() / want["loss"]) < 1e-2
    for key in want:
        if key not in ("loss", "nll"):
            assert float((got[key] - want[key]).norm() / want[key].norm().clamp(min=1e-12)) < 5e-2, key
