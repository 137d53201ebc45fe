"""Hand-written CPU kernels beside their plain torch equivalents, and the one switch between them.

Each is faster on CPU than its plain form and gives the same numbers (up to float rounding):

==============================================  =====================================================
hand-written (default)                          plain equivalent (``use_reference_ops(True)``)
==============================================  =====================================================
:func:`dropout`: keep masks from 16-bit lanes   ``F.dropout``
of 64-bit random words (:class:`_CpuDropout`)
:func:`scale_norm`: ScaleNorm with its backward  ``x * (g / x.norm(dim=-1).clamp(min=eps))``
written out (:class:`_ScaleNorm`)               under autograd
:func:`~transformer_mt.model.fused_loss.       logits ``F.linear(h, weight)``, then
fused_projected_label_smoothed_loss`:           :func:`transformer_mt.model.loss.label_smoothed_nll_loss`
vocabulary projection fused with the            (the switch is read by
label-smoothed loss in row chunks (its own      :func:`transformer_mt.model.loss.projected_label_smoothed_loss`)
module, :mod:`transformer_mt.model.fused_loss`)
:func:`linear` / :class:`Linear`: a training    ``F.linear``
step's float32 products through oneDNN
(:class:`_CpuLinear`); the fused loss's too
:func:`linear_relu`: the same with the ReLU as  ``F.relu(F.linear(...))``
oneDNN's post-op (the FFN's first product)
:func:`inference_linear`: a search's output     ``F.linear``
layer through oneDNN
:func:`residual_dropout`: x + dropout(y) in     ``x + dropout(y)``
one pass forward and one backward (C++,
:mod:`transformer_mt.model.native`)
ScaleNorm in C++, one pass forward and one      :class:`_ScaleNorm` (and under the switch, the
backward, where the kernels are built           plain formula)
==============================================  =====================================================

The switch is module state for the whole process, read at every call; the benchmark's "plain ops"
rows turn it on to measure the baseline of the speed-ups (instead of patching functions):

    use_reference_ops(True)             # from now on
    with use_reference_ops(True): ...   # only inside the block; the previous setting comes back after

Off CPU, ``dropout`` always uses ``F.dropout`` (the lane trick pays only where bernoulli_ is slow). The
switch also sends every attention through SDPA (:mod:`transformer_mt.model.attention` otherwise spells a CPU
training step's attention over few keys out as batched matmuls).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.model import native

_reference_ops = False


class _Restore:
    """What :func:`use_reference_ops` returns: as a context manager, puts the previous setting back on exit."""

    def __init__(self, previous: bool):
        self.previous = previous

    def __enter__(self) -> _Restore:
        return self

    def __exit__(self, *exc: object) -> None:
        global _reference_ops
        _reference_ops = self.previous


def use_reference_ops(enabled: bool = True) -> _Restore:
    """Run the plain torch equivalents (True) or the hand-written kernels (False) from now on; usable as
    ``with use_reference_ops(True):`` to switch for one block only."""
    global _reference_ops
    previous, _reference_ops = _reference_ops, bool(enabled)
    return _Restore(previous)


def reference_ops() -> bool:
    """Whether the plain equivalents are in use (see :func:`use_reference_ops`)."""
    return _reference_ops


# ---------------------------------------------------------------- dropout


class _CpuDropout(torch.autograd.Function):
    """Inverted dropout with the keep mask drawn from 16-bit lanes of 64-bit random words.

    ``F.dropout`` on CPU draws one mt19937 number per element through ``bernoulli_``, a large share of a
    small model's training step; one 64-bit random word per four elements costs a fraction of that.
    The drop probability is rounded to a multiple of
    1/65536 and the scale is 1 / (1 - that probability), so the output stays unbiased. The mask is
    saved as bool (1 byte per element) for the backward pass.
    """

    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:  # autograd's signature: ctx untyped
        n = x.numel()
        lanes = _random_words(n).view(torch.int16)[:n].view(x.shape)  # uniform over [-32768, 32767]
        drop = round(p * 65536)
        keep = lanes >= drop - 32768  # P(keep) = (65536 - drop) / 65536
        scale = 65536.0 / (65536 - drop)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` semantics (inverted dropout, identity in eval); a faster mask generator on CPU
    unless :func:`use_reference_ops` asked for ``F.dropout`` itself."""
    if not training or p == 0.0:
        return x
    if _lanes_do_not_apply(x, p):
        return F.dropout(x, p, True)
    return _CpuDropout.apply(x, p)


def _lanes_do_not_apply(x: Tensor, p: float) -> bool:
    """Whether dropout keeps ``F.dropout``: asked for, off CPU, or a p the 16-bit lanes cannot express."""
    return _reference_ops or x.device.type != "cpu" or p >= 1.0 or round(p * 65536) == 0


def _random_words(n: int) -> Tensor:
    """One uniform 64-bit word from torch's generator per four elements: 16-bit lanes for n keep masks. With the C++
    kernels built, ``torch.ops.tmt.random_words`` draws the same words (and leaves the generator in the same state)
    several times faster than ``random_``, which draws them one by one on one thread."""
    count = (n + 3) // 4
    if native.available():
        return torch.ops.tmt.random_words(count)
    return torch.empty(count, dtype=torch.int64).random_(-(2**63), 2**63 - 1)


class _CpuDropoutAdd(torch.autograd.Function):
    """x + dropout(y) with :class:`_CpuDropout`'s mask (the same random words, so the same numbers), in one C++ pass
    forward and one backward; the words are kept for the backward instead of a bool mask."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, p: float) -> Tensor:  # autograd's signature: ctx untyped
        words = _random_words(y.numel())
        drop = round(p * 65536)
        ctx.threshold, ctx.scale = drop - 32768, 65536.0 / (65536 - drop)
        ctx.save_for_backward(words)
        return torch.ops.tmt.dropout_add(x, y, words, ctx.threshold, ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        (words,) = ctx.saved_tensors
        return grad, torch.ops.tmt.dropout_backward(grad.contiguous(), words, ctx.threshold, ctx.scale), None


def residual_dropout(x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
    """x + dropout(y): a sublayer's output y added to the residual stream x (both (..., D)). On CPU in float32, with
    the C++ kernels built, one pass forward and one backward that give the same numbers as ``x + dropout(y)``."""
    if not training or p == 0.0:
        return x + y
    if (
        _lanes_do_not_apply(y, p)
        or x.dtype != torch.float32
        or y.dtype != torch.float32
        or x.shape != y.shape
        or not (x.is_contiguous() and y.is_contiguous())
        or not native.available()
    ):
        return x + dropout(y, p, training)
    return _CpuDropoutAdd.apply(x, y, p)


# ---------------------------------------------------------------- ScaleNorm


class _ScaleNorm(torch.autograd.Function):
    """y = g * x / max(||x||_2, eps) over the last dimension, with the backward written out.

    Under autograd the formula is five element-wise passes forward (norm, clamp, divide, two multiplies) and
    about twice that backward; a pre-norm model calls it two or three times per layer on every token. Here the
    forward is one reduction and one multiply, the backward one row dot product and one fused multiply-add:
    with s = g / max(||x||, eps) and c = s * (x . dy) / ||x||^2 where ||x|| >= eps (else 0),
    dx = s * dy - c * x and dg = sum over rows of (x . dy) / max(||x||, eps).
    """

    @staticmethod
    def forward(ctx, x: Tensor, g: Tensor, eps: float) -> Tensor:  # autograd's signature: ctx untyped
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (..., 1)
        clamped = norm.clamp(min=eps)
        scale = g / clamped  # (..., 1)
        ctx.save_for_backward(x, norm, clamped, scale, g)
        ctx.eps = eps
        return x * scale

    @staticmethod
    def backward(ctx, dy: Tensor):  # autograd's signature: ctx untyped
        x, norm, clamped, scale, g = ctx.saved_tensors
        dot = (x * dy).sum(-1, keepdim=True)  # (..., 1) x . dy
        dg = (dot / clamped).sum().reshape(g.shape) if ctx.needs_input_grad[1] else None
        c = torch.where(norm >= ctx.eps, scale * dot / norm.square(), 0.0)  # below eps the norm is the constant eps
        return torch.addcmul(dy * scale, x, c, value=-1.0), dg, None


def scale_norm(x: Tensor, g: Tensor, eps: float) -> Tensor:
    """ScaleNorm's formula g * x / max(||x||_2, eps) (..., D) -> (..., D); the written-out backward unless
    :func:`use_reference_ops` asked for the plain autograd form or no gradient is recorded (decoding)."""
    if (
        _reference_ops or not torch.is_grad_enabled()
    ):  # inference: the same ops without an autograd Function's call cost
        return x * (g / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=eps))
    if native_scale_norm_applies(x) and g.dtype == torch.float32:
        return _NativeScaleNorm.apply(x, g, eps)
    return _ScaleNorm.apply(x, g, eps)


def native_scale_norm_applies(x: Tensor) -> bool:
    """Whether :func:`scale_norm` runs the C++ kernel on ``x`` (with a float32 gain) in a training step: contiguous
    float32 on CPU, the kernels built, and not under :func:`use_reference_ops`."""
    return (
        not _reference_ops
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous()
        and native.available()
    )


class _NativeScaleNorm(torch.autograd.Function):
    """:class:`_ScaleNorm`'s formulas in C++: one pass over the rows forward (norm and scale), one backward."""

    @staticmethod
    def forward(ctx, x: Tensor, g: Tensor, eps: float) -> Tensor:  # autograd's signature: ctx untyped
        y, norm = torch.ops.tmt.scale_norm(x, g, eps)
        ctx.save_for_backward(x, norm, g)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):  # autograd's signature: ctx untyped
        x, norm, g = ctx.saved_tensors
        dx, dg = torch.ops.tmt.scale_norm_backward(dy.contiguous(), x, norm, g, ctx.eps)
        return dx, dg if ctx.needs_input_grad[1] else None, None


# ---------------------------------------------------------------- oneDNN products

# oneDNN's matmul, as torch's own CPU kernels for inductor call it (dense float32 tensors in, a new tensor out).
# torch sends a float32 ``mm`` to MKL. On an AMD EPYC, MKL ran the fused loss's forward product (inner dimension
# d_model, a few hundred rows by the whole vocabulary) at about two thirds of oneDNN's rate, and a training step's
# Linear layers 5-10% slower; on an Intel Xeon the two were even. The sums are float32 in another order
# (docs/benchmarks.md, "The training update against the matmul peak").
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None

# oneDNN keeps each matmul it has built (one per shape, holding buffers sized by the row count) in two caches, torch's
# ideep layer's and oneDNN's own, of 1,024 entries each by default. A training run meets a new row count with nearly
# every batch, so with the defaults a recipe run grew by 750 MiB in 300 updates and kept growing. Both are read at
# the first oneDNN call; 64 entries each keep the process within about 200 MiB of torch's mm path, at the same speed
# (docs/benchmarks.md). A value the user set is kept.
ONEDNN_CACHE_ENTRIES = 64
for _name in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
    os.environ.setdefault(_name, str(ONEDNN_CACHE_ENTRIES))


def onednn_applies(x: Tensor, w: Tensor) -> bool:
    return _onednn_linear is not None and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32


def times_transposed(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ w.T (+ bias)`` for x (n, k), w (m, k): through oneDNN for float32 on CPU, else torch's own product."""
    op = _onednn_linear
    if op is not None and onednn_applies(x, w):
        return op(x, w, bias, "none", [], "")
    return F.linear(x, w, bias)


def inference_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a product no gradient flows through (a search's output layer: a few to a
    few hundred rows by the whole vocabulary), through oneDNN for float32 on CPU, where it beats MKL at every row
    count; torch's own product otherwise (and under :func:`use_reference_ops`). Small layers keep F.linear there:
    oneDNN's fixed cost per call is larger than their product."""
    if _reference_ops or (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    ):
        return F.linear(x, weight, bias)
    return times_transposed(x, weight, bias)


class _CpuLinear(torch.autograd.Function):
    """``F.linear`` with its forward and input gradient through oneDNN; the weight gradient (inner dimension the
    batch's tokens) stays with torch's ``mm``, the faster of the two for that product."""

    @staticmethod
    def forward(ctx, x2: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # autograd's signature: ctx untyped
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return times_transposed(x2, weight, bias)  # (rows, out), not a view: the tensor the caller's views are of

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        x2, weight = ctx.saved_tensors
        return _linear_grads(ctx, grad, x2, weight)


def _linear_grads(ctx, grad: Tensor, x2: Tensor, weight: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The input, weight and bias gradients of ``x2 @ weight.T + bias`` that ``ctx`` asks for, given the output's."""
    grad_x = times_transposed(grad, weight.t()) if ctx.needs_input_grad[0] else None
    grad_w = grad.t() @ x2 if ctx.needs_input_grad[1] else None
    grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return grad_x, grad_w, grad_b


def _onednn_step(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether a product goes through oneDNN: a float32 CPU training step, not under autocast or
    :func:`use_reference_ops`."""
    return (
        not _reference_ops
        and torch.is_grad_enabled()
        and onednn_applies(x, weight)
        and (bias is None or bias.dtype == torch.float32)
        and not torch.is_autocast_enabled("cpu")
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; a float32 training step on CPU runs it through oneDNN (:class:`_CpuLinear`),
    unless :func:`use_reference_ops` asked for the plain form. Decoding, autocast and other devices keep F.linear."""
    if not _onednn_step(x, weight, bias):
        return F.linear(x, weight, bias)
    # The product on (rows, in) -> (rows, out), viewed as (..., out) outside the Function: views of the result (a fused
    # projection's q, k and v) then have the product itself as their base, which the C++ attention takes whole.
    return _CpuLinear.apply(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))


class _CpuLinearRelu(torch.autograd.Function):
    """``relu(F.linear(x, weight, bias))`` as :class:`_CpuLinear`, the ReLU applied by oneDNN to the product as it is
    written (a post-op) instead of in a pass of its own; backward masks the gradient with the output."""

    @staticmethod
    def forward(ctx, x2: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # autograd's signature: ctx untyped
        op = _onednn_linear
        assert op is not None  # linear_relu takes this path only where oneDNN is there
        out = op(x2, weight, bias, "relu", [], "")
        ctx.save_for_backward(x2, weight, out)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        x2, weight, out = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad, out, 0)  # relu's own backward: 0 where the output is 0
        return _linear_grads(ctx, grad, x2, weight)


def linear_relu(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.relu(F.linear(x, weight, bias))``: where :func:`linear` goes through oneDNN, with the ReLU fused into the
    product (:class:`_CpuLinearRelu`)."""
    if not _onednn_step(x, weight, bias):
        return F.relu(linear(x, weight, bias))
    return _CpuLinearRelu.apply(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose forward is :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
