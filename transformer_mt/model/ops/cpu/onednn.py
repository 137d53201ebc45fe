"""A CPU training step's float32 products through oneDNN, as autograd Functions.

torch sends a float32 ``mm`` to MKL. On an AMD EPYC, MKL ran the fused loss's forward product (inner dimension
d_model, a few hundred rows by the whole vocabulary) at about two thirds of oneDNN's rate, and a training step's
Linear layers 5-10% slower; on an Intel Xeon the two were even. The sums are float32 in another order
(docs/benchmarks.md, "The training update against the matmul peak"). oneDNN's primitive caches are bounded by
:func:`transformer_mt.runtime.set_environment_defaults`, which a command runs before the first product.

- :func:`times_transposed`: ``x @ w.T (+ bias)``, the one call of oneDNN's matmul;
- :class:`CpuLinear`: ``F.linear`` with its forward and input gradient through oneDNN;
- :class:`CpuLinearRelu`: the same with the ReLU as oneDNN's post-op (the FFN's first product).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# oneDNN's matmul, as torch's own CPU kernels for inductor call it (dense float32 tensors in, a new tensor out); a
# private op, the only way to reach oneDNN's matmul with a post-op (the ops/cpu package's docstring lists why).
onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None


def onednn_applies(x: Tensor, w: Tensor) -> bool:
    return onednn_linear is not None and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32


def times_transposed(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ w.T (+ bias)`` for x (n, k), w (m, k): through oneDNN for float32 on CPU, else torch's own product."""
    op = onednn_linear
    if op is not None and onednn_applies(x, w):
        return op(x, w, bias, "none", [], "")
    return F.linear(x, w, bias)


def onednn_step(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether a product goes through oneDNN: a float32 CPU training step, not under autocast."""
    return (
        torch.is_grad_enabled()
        and onednn_applies(x, weight)
        and (bias is None or bias.dtype == torch.float32)
        and not torch.is_autocast_enabled("cpu")
    )


class CpuLinear(torch.autograd.Function):
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


class CpuLinearRelu(torch.autograd.Function):
    """``relu(F.linear(x, weight, bias))`` as :class:`CpuLinear`, the ReLU applied by oneDNN to the product as it is
    written (a post-op) instead of in a pass of its own; backward masks the gradient with the output."""

    @staticmethod
    def forward(ctx, x2: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # autograd's signature: ctx untyped
        op = onednn_linear
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
