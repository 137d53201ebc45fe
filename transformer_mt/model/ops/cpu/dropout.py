"""Dropout on CPU with its keep masks drawn from 16-bit lanes of 64-bit random words, alone (:class:`CpuDropout`)
or added to the residual stream in one C++ pass (:class:`CpuDropoutAdd`)."""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.model.ops.cpu import native


class CpuDropout(torch.autograd.Function):
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
        lanes = random_words(n).view(torch.int16)[:n].view(x.shape)  # uniform over [-32768, 32767]
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


def lanes_do_not_apply(x: Tensor, p: float) -> bool:
    """Whether dropout keeps ``F.dropout``: off CPU, or a p the 16-bit lanes cannot express."""
    return x.device.type != "cpu" or p >= 1.0 or round(p * 65536) == 0


def random_words(n: int) -> Tensor:
    """One uniform 64-bit word from torch's generator per four elements: 16-bit lanes for n keep masks. With the C++
    kernels built, ``torch.ops.tmt.random_words`` draws the same words (and leaves the generator in the same state)
    several times faster than ``random_``, which draws them one by one on one thread."""
    count = (n + 3) // 4
    if native.available():
        return torch.ops.tmt.random_words(count)
    return torch.empty(count, dtype=torch.int64).random_(-(2**63), 2**63 - 1)


class CpuDropoutAdd(torch.autograd.Function):
    """x + dropout(y) with :class:`CpuDropout`'s mask (the same random words, so the same numbers), in one C++ pass
    forward and one backward; the words are kept for the backward instead of a bool mask."""

    @staticmethod
    def forward(ctx, x: Tensor, y: Tensor, p: float) -> Tensor:  # autograd's signature: ctx untyped
        words = random_words(y.numel())
        drop = round(p * 65536)
        ctx.threshold, ctx.scale = drop - 32768, 65536.0 / (65536 - drop)
        ctx.save_for_backward(words)
        return torch.ops.tmt.dropout_add(x, y, words, ctx.threshold, ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # autograd's signature: ctx untyped
        (words,) = ctx.saved_tensors
        return grad, torch.ops.tmt.dropout_backward(grad.contiguous(), words, ctx.threshold, ctx.scale), None
