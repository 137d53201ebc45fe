"""ScaleNorm g * x / max(||x||_2, eps) with its backward written out, in torch ops (:class:`WrittenOutScaleNorm`, any
device) and in C++ (:class:`NativeScaleNorm`, a float32 CPU training step with the kernels built)."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.model.ops.cpu import native


class WrittenOutScaleNorm(torch.autograd.Function):
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


def native_scale_norm_applies(x: Tensor) -> bool:
    """Whether :class:`NativeScaleNorm` computes ``x`` (with a float32 gain) in a training step: contiguous float32 on
    CPU, the kernels built."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and native.available()


class NativeScaleNorm(torch.autograd.Function):
    """:class:`WrittenOutScaleNorm`'s formulas in C++: one pass over the rows forward (norm and scale), one backward."""

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
