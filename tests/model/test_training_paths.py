"""The cpu backend's training-step fast paths compute what the reference backend's plain forms compute, values and
gradients:

- attention spelled out as two batched matmuls and a softmax (a CPU training step over few keys) against SDPA;
- ScaleNorm's written-out backward (``CpuOps.scale_norm``) against autograd through the formula;
- the Linear layers and the fused loss's vocabulary products through oneDNN against F.linear and torch's mm.

The model-level checks run real Multi30k pairs, tokenized by the session's sentencepiece model, through the
loss module that training runs (TeacherForcedLoss), and compare every parameter's gradient.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import transformer_mt.model.ops.cpu.onednn as onednn
from tests.conftest import head, tiny_model
from transformer_mt.data import collate
from transformer_mt.model import TeacherForcedLoss, choose_ops
from transformer_mt.model.linear import Linear
from transformer_mt.model.ops.cpu import CpuOps
from transformer_mt.model.ops.cpu.attention import SHORT_KEYS
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.text import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
CPU, REFERENCE = CpuOps(), ReferenceOps()
scale_norm = CPU.scale_norm


def _plain_scale_norm(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return x * (g / x.norm(dim=-1, keepdim=True).clamp(min=eps))  # the formula, differentiated by autograd


def test_scale_norm_kernel_equals_autograd_through_the_formula():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=gen, dtype=torch.float64)
    x[3] = 0.0  # a zero row (FixNorm's PAD row; a padded position): below eps, the norm is the constant eps
    x[5] *= 1e-8  # a tiny row, also below eps
    x[7] *= 1e-5 / x[7].norm() * 1.01  # just above eps
    dy = torch.randn(64, 48, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (scale_norm, _plain_scale_norm):
        xx, g = x.clone().requires_grad_(), torch.tensor(3.7, dtype=torch.float64, requires_grad=True)
        y = fn(xx, g, 1e-5)
        y.backward(dy)
        grads.append((y.detach(), xx.grad, g.grad))
    for ours, plain in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-12, atol=1e-12)
    small = (x[:6, :8].clone().requires_grad_(), torch.tensor(2.0, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(lambda a, b: scale_norm(a, b, 1e-5), small)


def test_scale_norm_kernel_keeps_the_input_shape_and_the_scalar_gain():
    x = torch.randn(2, 5, 16, requires_grad=True)
    g = torch.tensor(4.0, requires_grad=True)
    scale_norm(x, g, 1e-5).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape and g.grad is not None and g.grad.shape == ()
    # the reference backend gives the plain form, same numbers
    torch.testing.assert_close(REFERENCE.scale_norm(x, g, 1e-5), _plain_scale_norm(x, g, 1e-5))


def _real_batch(corpus_slice, spm_model, n: int = 24):
    tok = Tokenizer(spm_model)
    src = tok.encode(head(corpus_slice["train.en"], n, skip=100))
    tgt = tok.encode(head(corpus_slice["train.de"], n, skip=100))
    return tok.vocab_size, collate(list(zip(src, tgt, strict=True)))


def _loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, _, _ = TeacherForcedLoss(model, label_smoothing=0.1)(
        batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded
    )
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm", ["post", "pre", "scale"])
def test_spelled_out_attention_trains_as_sdpa_does_on_real_pairs(norm, corpus_slice, spm_model, monkeypatch):
    """The cpu backend's attention (spelled out, or the C++ kernel where built) against the reference backend's SDPA,
    the rest of the step the same (both cpu, SDPA forced by the predicate), then the whole step on the reference
    backend."""
    vocab, batch = _real_batch(corpus_slice, spm_model)
    assert batch.src_padded and batch.src.size(1) <= SHORT_KEYS  # key padding masks, short enough for the fast path
    model = tiny_model(
        vocab, norm=norm, share_all_embeddings=True
    ).train()  # dropout 0: both paths see the same numbers
    ops = model.ops
    assert isinstance(ops, CpuOps)
    calls: list[bool] = []
    real = ops.spelled_out_is_faster

    def recorded(k: torch.Tensor) -> bool:
        calls.append(real(k))
        return calls[-1]

    monkeypatch.setattr(ops, "spelled_out_is_faster", recorded)
    spelled = _loss_and_grads(model, batch)
    assert calls and all(calls)  # every attention of the step took the spelled-out path
    monkeypatch.setattr(ops, "spelled_out_is_faster", lambda k: False)
    sdpa = _loss_and_grads(model, batch)
    reference = _loss_and_grads(model.use_ops(choose_ops("reference")), batch)
    for plain in (sdpa, reference):
        torch.testing.assert_close(spelled[0], plain[0], rtol=1e-5, atol=1e-5)
        assert spelled[1].keys() == plain[1].keys()
        for name, grad in spelled[1].items():
            scale = float(grad.abs().max())  # float32 sums in another order: agreement relative to the gradient's size
            torch.testing.assert_close(
                grad, plain[1][name], rtol=1e-4, atol=1e-5 * scale, msg=f"{name}: the gradients differ"
            )


def test_the_fast_path_is_for_cpu_training_over_few_keys_only(monkeypatch):
    k = torch.zeros(2, 4, SHORT_KEYS, 8)
    assert CPU.spelled_out_is_faster(k)
    assert not CPU.spelled_out_is_faster(torch.zeros(2, 4, SHORT_KEYS + 1, 8))  # long: SDPA's kernel
    with torch.no_grad():
        assert not CPU.spelled_out_is_faster(k)  # inference keeps SDPA (decoding is unchanged)
    # the reference backend (the benchmark's "plain ops" rows) never spells it out: SDPA for every attention
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    REFERENCE.attention(q, q, q, None, causal=True, dropout_p=0.0, need_weights=False)
    assert calls == [1]


def test_scale_norm_model_gradients_equal_the_plain_formula_on_real_pairs(corpus_slice, spm_model, monkeypatch):
    vocab, batch = _real_batch(corpus_slice, spm_model)
    model = tiny_model(vocab, norm="scale", share_all_embeddings=True).train()
    ours = _loss_and_grads(model, batch)
    monkeypatch.setattr(model.ops, "scale_norm", _plain_scale_norm)  # the ScaleNorm layers' formula only
    plain = _loss_and_grads(model, batch)
    torch.testing.assert_close(ours[0], plain[0], rtol=1e-6, atol=1e-6)
    for name, grad in ours[1].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(
            grad, plain[1][name], rtol=1e-4, atol=1e-5 * scale, msg=f"{name}: the gradients differ"
        )


def _took_onednn(y: torch.Tensor) -> bool:
    """Whether ``CpuOps.linear``'s output came from :class:`onednn.CpuLinear` (viewed to the input's leading shape)."""
    node = y.grad_fn
    while node is not None and type(node).__name__ == "ViewBackward0":
        node = node.next_functions[0][0]
    return node is not None and "CpuLinear" in type(node).__name__


needs_onednn = pytest.mark.skipif(
    onednn.onednn_linear is None, reason="this torch build has no oneDNN (mkldnn) CPU kernels"
)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_equals_f_linear_in_value_and_gradients(bias):
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(40, 24, generator=gen)
    rows = weight[8:]  # a row slice of a fused matrix, as cross-attention's K/V projection takes it
    b = torch.randn(32, generator=gen) if bias else None
    x = torch.randn(3, 7, 24, generator=gen)
    dy = torch.randn(3, 7, 32, generator=gen)
    results = []
    for fn in (CPU.linear, F.linear):
        xx, w = x.clone().requires_grad_(), weight.clone().requires_grad_()
        bb = b.clone().requires_grad_() if b is not None else None
        y = fn(xx, w[8:], bb)
        y.backward(dy)
        results.append([y.detach(), xx.grad, w.grad] + ([bb.grad] if bb is not None else []))
        if fn is not F.linear:
            assert _took_onednn(y)  # the oneDNN path was taken
    for ours, plain in zip(*results, strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    weight_grad = results[0][2]
    assert weight_grad is not None and weight_grad[:8].abs().max() == 0  # rows outside the slice get no gradient
    torch.testing.assert_close(CPU.linear(x, rows, b), F.linear(x, rows, b), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_linear_with_its_relu_fused_equals_relu_of_f_linear():
    gen = torch.Generator().manual_seed(6)
    x, weight, b = (
        torch.randn(3, 7, 24, generator=gen),
        torch.randn(32, 24, generator=gen),
        torch.randn(32, generator=gen),
    )
    dy = torch.randn(3, 7, 32, generator=gen)
    results = []
    for fused in (True, False):
        xx, w, bb = (t.clone().requires_grad_() for t in (x, weight, b))
        y = CPU.linear_relu(xx, w, bb) if fused else F.relu(F.linear(xx, w, bb))
        y.backward(dy)
        results.append((y.detach(), xx.grad, w.grad, bb.grad))
        if fused:
            assert y.grad_fn is not None
            assert _took_onednn(y) and "Relu" in type(y.grad_fn.next_functions[0][0]).__name__
    assert 0.3 < float((results[1][0] == 0).float().mean()) < 0.7  # the ReLU cut about half the outputs
    for ours, plain in zip(*results, strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(CPU.linear_relu(x, weight, b), F.relu(F.linear(x, weight, b)))  # decoding: the plain ops


@needs_onednn
def test_onednn_linear_is_for_a_float32_cpu_training_step_only():
    x, w = torch.randn(5, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)

    def took_onednn() -> bool:
        y = CPU.linear(x, w)
        return _took_onednn(y)

    assert took_onednn()
    with torch.no_grad():
        assert CPU.linear(x, w).grad_fn is None  # decoding: F.linear
    assert not _took_onednn(REFERENCE.linear(x, w))  # the reference backend: the benchmark's "plain ops" rows
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert CPU.linear(x, w).dtype == torch.bfloat16  # autocast's own cast and product
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double()
    assert not _took_onednn(CPU.linear(x64, w64))


@needs_onednn
@pytest.mark.parametrize("norm", ["post", "scale"])
def test_onednn_products_train_as_torch_mm_does_on_real_pairs(norm, corpus_slice, spm_model, monkeypatch):
    """Every Linear of the step and the fused loss's vocabulary products through oneDNN, against the same step with
    oneDNN switched off (F.linear and torch's mm): the loss and every parameter's gradient."""
    vocab, batch = _real_batch(corpus_slice, spm_model)
    model = tiny_model(vocab, norm=norm, share_all_embeddings=True).train()
    calls = []
    real = onednn.onednn_linear
    assert real is not None

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(onednn, "onednn_linear", counted)
    ours = _loss_and_grads(model, batch)
    n_linear = sum(isinstance(m, Linear) for m in model.modules())
    assert n_linear and len(calls) >= 2 * n_linear  # each Linear forward and backward, and the attention in-projections
    monkeypatch.setattr(onednn, "onednn_linear", None)
    plain = _loss_and_grads(model, batch)
    monkeypatch.undo()
    reference = _loss_and_grads(model.use_ops(choose_ops("reference")), batch)  # F.linear, torch's mm, no fusion
    for other in (plain, reference):
        torch.testing.assert_close(ours[0], other[0], rtol=1e-5, atol=1e-5)
        assert ours[1].keys() == other[1].keys()
        for name, grad in ours[1].items():
            scale = float(grad.abs().max())
            torch.testing.assert_close(
                grad, other[1][name], rtol=1e-4, atol=1e-5 * scale, msg=f"{name}: the gradients differ"
            )


@needs_onednn
def test_the_search_output_product_goes_through_onednn_without_gradients_only(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(5, 16, generator=gen), torch.randn(300, 16, generator=gen), torch.randn(300, generator=gen)
    calls = []
    real = onednn.onednn_linear
    assert real is not None

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(onednn, "onednn_linear", counted)
    with torch.inference_mode():
        torch.testing.assert_close(CPU.output_linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(CPU.output_linear(x[:1], w), F.linear(x[:1], w), rtol=1e-5, atol=1e-5)
    assert calls == [(5, 16), (1, 16)]
    wg = w.clone().requires_grad_()
    y = CPU.output_linear(x, wg, b)  # a gradient to record: torch's own product, differentiable
    y.sum().backward()
    assert len(calls) == 2 and wg.grad is not None
    with torch.no_grad():
        REFERENCE.output_linear(x, w, b)
    assert len(calls) == 2


_GROWTH = """
import ctypes, ctypes.util, sys, torch
from transformer_mt import runtime
runtime.set_environment_defaults()  # what tmt and load() run first: oneDNN's caches bounded
from transformer_mt.model.ops.cpu import CpuOps
CPU = CpuOps()
torch.set_num_threads(1)
libc = ctypes.CDLL(ctypes.util.find_library("c"))
def rss():  # what the process holds: freed heap given back first (else the heap's high-water mark moves the figure)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
w = torch.randn(256, 128, requires_grad=True)
CPU.linear(torch.randn(8, 128), w).sum().backward()
start = rss()
for i, rows in enumerate(range(1500, 1700)):  # a new row count each call, as a training run's batches bring them
    CPU.linear(torch.randn(rows, 128), w).sum().backward()
    if i == 99:
        half = rss() - start
print(half, rss() - start)
"""


@needs_onednn
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident set from /proc")
def test_onednn_caches_are_bounded_so_new_row_counts_do_not_grow_the_process(tmp_path):
    """200 row counts, forward and backward each, the resident set read after giving freed heap back (malloc_trim:
    without it the heap's high-water mark moved the second hundred's figure by -36 to +73 MiB from run to run). With
    the bound the process stops growing once the caches are full (on the AMD EPYC: 27.7 MiB over the first hundred,
    0.1 more over the next, in six runs). With oneDNN's and ideep's default 1,024 entries it grows all along, by about
    0.58 MiB per row count there (58 MiB, then 58 more); on an Intel Xeon (torch 2.11) the primitives were a tenth of
    that size, too small to tell, and the comparison is left out."""
    env = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}

    def growth(**extra: str) -> tuple[float, float]:
        out = subprocess.run(
            [sys.executable, "-c", _GROWTH], env={**env, **extra}, capture_output=True, text=True, check=True
        )
        first, total = map(float, out.stdout.split()[-2:])
        return first, total - first  # MiB over the first 100 row counts, and over the next 100

    bounded = growth()
    assert bounded[1] < 10, f"still growing: {bounded[1]:.0f} MiB over row counts 100-200, {bounded[0]:.0f} MiB before"
    unbounded = growth(LRU_CACHE_CAPACITY="1024", ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024")
    if unbounded[0] > 40:  # where oneDNN's primitives are large, the defaults keep growing (so the test can fail)
        assert unbounded[1] > 30, f"the defaults grew by only {unbounded[1]:.0f} MiB over row counts 100-200"
