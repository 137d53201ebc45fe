"""The cuda backend's loss (model/ops/chunked_loss.py): the vocabulary projection and the label-smoothed loss in row
chunks, the gradient taken in the forward, against the reference backend's logits-then-loss, values and gradients.

The expectations are the reference backend's plain formula (``F.linear`` then ``label_smoothed_sums``) under
autograd, in float32 or float64; the chunked loss must match it to float32 rounding, and under bf16 autocast stay
as close to the float64 truth as the reference's own bf16 autocast does.
"""

from __future__ import annotations

import pytest
import torch

from transformer_mt.model.ops.chunked_loss import (
    EAGER,
    ChunkPasses,
    chunk_rows,
    chunked_projected_sums,
    row_sums,
    row_sums_and_grad,
)
from transformer_mt.model.ops.cuda import CudaOps
from transformer_mt.model.ops.reference import ReferenceOps

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, V = 45, 24, 70  # 45 rows: chunks of 16 leave a remainder of 13


def _inputs(dtype: torch.dtype = torch.float32, *, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(V, D, generator=g, dtype=dtype) * 0.3).requires_grad_()
    b = (torch.randn(V, generator=g, dtype=dtype) * 0.1).requires_grad_() if bias else None
    target = torch.randint(0, V, (N,), generator=g)
    target[[3, 17, 40]] = -1  # rows that count for nothing
    return h, w, b, target


def _loss_and_grads(fn, h, w, b, target, *, epsilon: float) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    leaves = [x for x in (h, w, b) if x is not None]
    for x in leaves:
        x.grad = None
    loss, nll = fn(h, w, target, epsilon=epsilon, bias=b, ignore_index=-1)
    loss.backward()
    return loss.detach(), nll, [x.grad.clone() for x in leaves]


def _reference(h, w, target, *, epsilon, bias, ignore_index):
    return ReferenceOps().projected_loss(h, w, target, epsilon=epsilon, bias=bias, ignore_index=ignore_index)


def _chunked(rows: int, passes: ChunkPasses = EAGER):
    def loss(h, w, target, *, epsilon, bias, ignore_index):
        return chunked_projected_sums(
            h, w, target, epsilon=epsilon, bias=bias, ignore_index=ignore_index, rows=rows, passes=passes
        )

    return loss


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows", [16, 1000])  # three chunks with a remainder; one chunk
@pytest.mark.parametrize("bias", [True, False])
def test_float32_equals_the_reference_loss_and_gradients(epsilon, rows, bias):
    h, w, b, target = _inputs(bias=bias)
    want = _loss_and_grads(_reference, h, w, b, target, epsilon=epsilon)
    got = _loss_and_grads(_chunked(rows), h, w, b, target, epsilon=epsilon)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-4)
    for g, r in zip(got[2], want[2]):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_the_backend_scales_the_gradient_by_the_upstream_one():
    """The gradients are taken in the forward; the backward multiplies them by d(objective)/d(loss_sum), here 1/7."""
    h, w, b, target = _inputs()
    ops = CudaOps(loss_chunk_rows=16)
    grads = []
    for fn in (ops.projected_loss, _reference):
        for x in (h, w, b):
            x.grad = None
        loss, _ = fn(h, w, target, epsilon=0.1, bias=b, ignore_index=-1)
        (loss / 7.0).backward()
        grads.append([x.grad for x in (h, w, b)])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_without_a_gradient_the_sums_are_the_same():
    h, w, b, target = _inputs()
    with torch.no_grad():
        loss, nll = _chunked(16)(h, w, target, epsilon=0.1, bias=b, ignore_index=-1)
        want_loss, want_nll = _reference(h, w, target, epsilon=0.1, bias=b, ignore_index=-1)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(nll, want_nll, rtol=1e-6, atol=1e-4)


def test_no_tensor_of_rows_by_vocabulary_is_kept_for_the_backward():
    """The point of the chunks: what autograd keeps is the (N, D) and (V, D) gradients, never (N, V) logits or
    probabilities; and no chunk's logits have more rows than a chunk."""
    h, w, _, target = _inputs(bias=False)
    saved: list[torch.Size] = []
    chunks: list[torch.Size] = []

    def sums_and_grad(logits, *args):
        chunks.append(logits.shape)
        return row_sums_and_grad(logits, *args)

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = _chunked(16, ChunkPasses(sums_and_grad=sums_and_grad))(
            h, w, target, epsilon=0.1, bias=None, ignore_index=-1
        )
    loss.backward()
    assert chunks == [(16, V), (16, V), (13, V)]
    assert sorted(saved) == sorted([torch.Size([N, D]), torch.Size([V, D])])


def test_bfloat16_autocast_is_as_close_to_the_truth_as_the_reference_autocast():
    """Under bf16 autocast the products round to 8 significant bits; the chunked loss keeps the softmax, the sums and
    the weight gradient's accumulation in float32. Tolerance: loss within 0.5% of the float64 truth, each gradient
    within 2% (relative norm of the difference), and never more than 1.5x the reference autocast's own error."""
    h64, w64, b64, target = _inputs(torch.float64)
    truth = _loss_and_grads(_reference, h64, w64, b64, target, epsilon=0.1)
    h, w, b = (x.detach().float().requires_grad_() for x in (h64, w64, b64))
    errors = {}
    for name, fn in (("reference", _reference), ("chunked", _chunked(16))):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, grads = _loss_and_grads(fn, h, w, b, target, epsilon=0.1)
        assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
        errors[name] = [abs(loss.double() - truth[0]) / truth[0]] + [
            (g.double() - t).norm() / t.norm() for g, t in zip(grads, truth[2])
        ]
    loss_error, *grad_errors = errors["chunked"]
    assert loss_error < 5e-3
    assert max(grad_errors) < 2e-2
    for mine, theirs in zip(errors["chunked"], errors["reference"]):
        assert mine <= 1.5 * theirs + 1e-4, (errors["chunked"], errors["reference"])


def test_compiled_passes_equal_the_eager_ones():
    """The passes as ``torch.compile`` traces them (aot_eager: forward and backward graphs, no code generation)."""
    passes = ChunkPasses(
        sums=torch.compile(row_sums, backend="aot_eager", dynamic=True),
        sums_and_grad=torch.compile(row_sums_and_grad, backend="aot_eager", dynamic=True),
    )
    h, w, b, target = _inputs()
    want = _loss_and_grads(_chunked(16), h, w, b, target, epsilon=0.1)
    got = _loss_and_grads(_chunked(16, passes), h, w, b, target, epsilon=0.1)
    torch.testing.assert_close(got[0], want[0])
    for g, r in zip(got[2], want[2]):
        torch.testing.assert_close(g, r)
    with torch.no_grad():
        torch.testing.assert_close(_chunked(16, passes)(h, w, target, epsilon=0.1, bias=b, ignore_index=-1)[0], want[0])


def test_no_rows_give_zero_loss_and_zero_gradients():
    h, w, _, _ = _inputs(bias=False)
    loss, nll = _chunked(16)(h[:0], w, torch.zeros(0, dtype=torch.long), epsilon=0.1, bias=None, ignore_index=-1)
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(nll) == 0.0
    assert w.grad is not None and not w.grad.any()


def test_chunk_rows_are_whole_tiles_within_the_budget():
    assert chunk_rows(37_000) % 64 == 0 and chunk_rows(37_000) * 37_000 <= 2**27
    assert chunk_rows(70, elements=1000) == 14  # under one tile: as many rows as fit
    assert chunk_rows(10**9) == 1


@pytest.mark.cuda
def test_on_a_gpu_bf16_matches_the_reference_loss():
    """The same comparison on CUDA, where the weight gradient's products write float32 (mm's out_dtype)."""
    h, w, b, target = (x.cuda() if x is not None else None for x in _inputs())
    h, w, b = (x.detach().requires_grad_() for x in (h, w, b))  # type: ignore[union-attr]
    want = _loss_and_grads(_reference, h, w, b, target, epsilon=0.1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = _loss_and_grads(_chunked(16), h, w, b, target, epsilon=0.1)
    torch.testing.assert_close(got[0], want[0], rtol=5e-3, atol=1e-2)
    for g, r in zip(got[2], want[2]):
        assert float((g - r).norm() / r.norm()) < 2e-2
