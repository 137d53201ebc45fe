"""The CPU backend: which of its kernels computes each operation, decided per call from what it is given.

Every method falls back to :class:`~transformer_mt.model.ops.reference.ReferenceOps` (the plain form) where its kernel
does not apply: another dtype, no gradient to record, a shape the kernel does not take, the C++ kernels not built.

======================  =====================================================================================
operation               fast path (and where it applies)
======================  =====================================================================================
``linear``              oneDNN forward and input gradient (a float32 training step, not under autocast)
``linear_relu``         the same with the ReLU as oneDNN's post-op
``output_linear``       oneDNN (float32, no gradient to record: a search's output layer, validation)
``dropout``             keep masks from 16-bit lanes of 64-bit random words (drawn in C++ when built)
``residual_dropout``    x + dropout(y) in one C++ pass forward and one backward (float32, same shapes)
``scale_norm``          the backward written out, in C++ for contiguous float32 (training); the formula otherwise
``normalize``           ScaleNorm's C++ kernel with the gain 1 (training); ``F.normalize`` otherwise
``attention``           a training step over at most :data:`~.attention.SHORT_KEYS` keys: the C++ kernel
                        (float32, head sizes multiples of 16, a key-padding mask or none, no attention dropout),
                        else the product spelled out; SDPA otherwise
``*_attention_step``    at least :data:`~.attention.STEP_SPELLED_OUT_ROWS` rows: spelled out for the cache's layout
``projected_loss``      the vocabulary projection fused with the loss in row chunks (:mod:`.fused_loss`)
======================  =====================================================================================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.model.ops.cpu import native
from transformer_mt.model.ops.cpu.attention import (
    SHORT_KEYS,
    kernel_takes,
    short_attention,
)
from transformer_mt.model.ops.cpu.dropout import CpuDropout, CpuDropoutAdd, lanes_do_not_apply
from transformer_mt.model.ops.cpu.generic import GenericFastPaths
from transformer_mt.model.ops.cpu.onednn import CpuLinear, CpuLinearRelu, onednn_step, times_transposed
from transformer_mt.model.ops.cpu.scale_norm import NativeScaleNorm, WrittenOutScaleNorm, native_scale_norm_applies
from transformer_mt.model.ops.reference import join_heads


class CpuOps(GenericFastPaths):
    """The CPU's fast paths (the module's docstring), each falling back to the reference form."""

    name = "cpu"
    short_keys = SHORT_KEYS  # the most keys a training step's attention spells out (or gives the C++ kernel)

    # ---------------------------------------------------------------- products
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if not onednn_step(x, weight, bias):
            return F.linear(x, weight, bias)
        # The product on (rows, in) -> (rows, out), viewed as (..., out) outside the Function: views of the result (a
        # fused projection's q, k and v) then have the product itself as their base, which the C++ attention takes.
        return CpuLinear.apply(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))

    def linear_relu(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if not onednn_step(x, weight, bias):
            return F.relu(self.linear(x, weight, bias))
        return CpuLinearRelu.apply(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))

    def output_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """oneDNN beats MKL at every row count of a search's output layer (a few to a few hundred rows by the whole
        vocabulary); a product a gradient flows through keeps ``F.linear``."""
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return F.linear(x, weight, bias)
        return times_transposed(x, weight, bias)

    # ---------------------------------------------------------------- dropout
    def dropout(self, x: Tensor, p: float, training: bool) -> Tensor:
        if not training or p == 0.0:
            return x
        if lanes_do_not_apply(x, p):
            return F.dropout(x, p, True)
        return CpuDropout.apply(x, p)

    def residual_dropout(self, x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
        if not training or p == 0.0:
            return x + y
        if (
            lanes_do_not_apply(y, p)
            or x.dtype != torch.float32
            or y.dtype != torch.float32
            or x.shape != y.shape
            or not (x.is_contiguous() and y.is_contiguous())
            or not native.available()
        ):
            return x + self.dropout(y, p, training)
        return CpuDropoutAdd.apply(x, y, p)

    # ---------------------------------------------------------------- norms
    def scale_norm(self, x: Tensor, g: Tensor, eps: float) -> Tensor:
        if not torch.is_grad_enabled():  # inference: the formula, without an autograd Function's call cost
            return super().scale_norm(x, g, eps)
        if native_scale_norm_applies(x) and g.dtype == torch.float32:
            return NativeScaleNorm.apply(x, g, eps)
        return WrittenOutScaleNorm.apply(x, g, eps)

    def normalize(self, x: Tensor, eps: float) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad and native_scale_norm_applies(x):
            return NativeScaleNorm.apply(x, x.new_ones(()), eps)  # the same formula, one pass each way
        return super().normalize(x, eps)

    # ---------------------------------------------------------------- attention
    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None,
        *,
        causal: bool,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        short = self.spelled_out_is_faster(k)
        if short and not need_weights and dropout_p == 0.0 and kernel_takes(q, k, v, allowed) and native.available():
            keys = None if allowed is None else allowed.reshape(q.size(0), -1)  # (B, 1, 1, K) -> (B, K)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D) -> (B, T, H, D)
            return short_attention(qt, kt, vt, keys, causal=causal, scale=q.size(-1) ** -0.5), None  # (B, T, H*Dv)
        if need_weights or short:
            out, weights = self.spelled_out(q, k, v, allowed, causal=causal, dropout_p=dropout_p)
            return join_heads(out), weights if need_weights else None
        return super().attention(q, k, v, allowed, causal=causal, dropout_p=dropout_p, need_weights=False)

    def spelled_out_is_faster(self, k: Tensor) -> bool:
        """Whether a training step on CPU attends over few enough keys (k: (B, H, K, Dk)) for the spelled-out product
        or the C++ kernel rather than SDPA's flash kernel."""
        return k.device.type == "cpu" and k.size(2) <= self.short_keys and torch.is_grad_enabled()
