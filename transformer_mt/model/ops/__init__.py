"""The operations of the Transformer that have fast paths, as one interface (:class:`Ops`), and the choice of the
backend that computes them (:func:`choose_ops`).

The model files state each equation once and compute it through the backend the model holds
(``Transformer(..., ops=...)``, :meth:`~transformer_mt.model.transformer.Transformer.use_ops`), which is chosen when
a model is built or loaded, from its device and the user's override (``train.ops``, ``load(..., ops=...)``):

=============  ======================================================================================================
``reference``  plain torch, the formulas (:mod:`~transformer_mt.model.ops.reference`): the numbers every other
               backend is tested against
``cpu``        the CPU's fast paths (:mod:`~transformer_mt.model.ops.cpu`): oneDNN products, dropout masks from
               16-bit lanes, C++ kernels of a training step (compiled on first use), the loss fused with the
               vocabulary projection, a decoding step's attention spelled out
``cuda``       a GPU's (:mod:`~transformer_mt.model.ops.cuda`): SDPA held to its flash and memory-efficient
               kernels, the loss in row chunks with bf16 products and float32 sums
               (:mod:`~transformer_mt.model.ops.chunked_loss`), and the CPU package's device-generic paths; the
               place the CUDA kernels grow
=============  ======================================================================================================

Training compiles the layers and the loss's passes with ``torch.compile``, by region
(:mod:`~transformer_mt.model.ops.compiling`, ``train.compile``): the cuda and reference backends trace, the cpu
backend's C++ kernels do not (it is never compiled).

``auto`` is ``cpu`` on a CPU and ``cuda`` on any other device (an MPS device gets the same paths, without the
kernel pinning, which is CUDA's). A backend holds no state and changes none: two models with different backends
compute side by side in one process. Inside a backend, the choice among its own kernels is made per call from what
it is given (device, dtype, shapes, whether autograd records), since one model trains, validates and decodes with
one backend and its weights may be cast after it is built; the dtype and the training mode therefore do not choose
the backend.

Shapes: B batch, T query positions, K key positions, D d_model, H heads, Dk / Dv key / value size per head, R rows
of a decoding step, G groups of rows (a sentence's beams), V vocabulary. Attention masks (``allowed``) are bool,
True = this query may attend to this key (:mod:`~transformer_mt.model.attention`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from transformer_mt.config import ConfigError

OPS_CHOICES = ("auto", "reference", "cpu", "cuda")  # train.ops and load(..., ops=...)


class Ops(Protocol):
    """What the model computes through its backend. Every method has the semantics of its plain torch form in
    :class:`~transformer_mt.model.ops.reference.ReferenceOps`, values and gradients, up to float rounding."""

    name: str  # the backend's name in OPS_CHOICES

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``F.linear``: x (..., in), weight (out, in), bias (out,) or None -> (..., out)."""
        ...

    def linear_relu(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``relu(linear(x, weight, bias))``: the feed-forward network's first product (section 3.3)."""
        ...

    def output_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``F.linear`` for the output layer's logits, x (..., D), weight (V, D): mostly a product no gradient flows
        through (a search's step, validation)."""
        ...

    def dropout(self, x: Tensor, p: float, training: bool) -> Tensor:
        """Inverted dropout with ``F.dropout``'s semantics; ``x`` itself when not training or p is 0."""
        ...

    def residual_dropout(self, x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
        """``x + dropout(y)``: a sublayer's output y (..., D) added to the residual stream x (..., D) (section 5.4)."""
        ...

    def scale_norm(self, x: Tensor, g: Tensor, eps: float) -> Tensor:
        """ScaleNorm ``g * x / max(||x||_2, eps)`` over the last dimension: (..., D) -> (..., D), g a scalar."""
        ...

    def normalize(self, x: Tensor, eps: float) -> Tensor:
        """``F.normalize(x, dim=-1, eps=eps)``: rows (..., D) scaled to length 1 (FixNorm's)."""
        ...

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
        """softmax(q k^T / sqrt(Dk)) v over heads (section 3.2.1), the heads joined: q (B, H, T, Dk), k (B, H, K, Dk),
        v (B, H, K, Dv) -> (B, T, H * Dv), and with ``need_weights`` the weights (B, H, T, K) (else None), taken
        before attention dropout, exactly 0 on blocked keys.

        ``allowed`` broadcastable to (B, H, T, K), True = attend; None = every key, or with ``causal`` (T == K) the
        keys at or before the query's position. ``dropout_p``: dropout on the weights (0 outside training)."""
        ...

    def varlen_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_q: Tensor,
        cu_k: Tensor,
        max_q: int,
        max_k: int,
        *,
        causal: bool,
        dropout_p: float,
    ) -> Tensor:
        """Attention over sentences packed end to end (flash attention's varlen layout): q (Nq, H, Dk), k (Nk, H, Dk),
        v (Nk, H, Dv) -> (Nq, H, Dv). ``cu_q`` / ``cu_k`` (B + 1,) int32 cumulative lengths: query sentence b holds
        rows [cu_q[b], cu_q[b + 1]) and sees exactly the keys [cu_k[b], cu_k[b + 1]) (a block-diagonal mask), with
        ``causal`` (the same lengths) only those at or before its position; ``max_q`` / ``max_k`` the longest
        sentences (host ints); every sentence holds at least one key. ``dropout_p``: on the weights (0 outside
        training)."""
        ...

    def self_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, allowed: Tensor | None = None
    ) -> Tensor:
        """A decoding step's self-attention over the cache: q (R, H, 1, Dk), k (R, H, T, Dk), v (R, H, T, Dv), views
        of the growing cache's time-major (T, R, H, D) buffers or the static cache's (R, H, T, D) ones
        -> (R, 1, H * Dv). ``allowed`` None: no mask (every cached position is in the query's past, the growing
        cache); else (1 or R, 1, 1, T) True = attend, the filled prefix of a static cache (its other positions hold
        finite stale values)."""
        ...

    def cross_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, dropout_p: float
    ) -> Tensor:
        """A decoding step's attention over the source, a sentence's beams as its query positions: q (G, H, group,
        Dk), k (G, H, S, Dk), v (G, H, S, Dv), ``allowed`` (G, 1, 1, S) True = attend or None -> (G, group, H * Dv)."""
        ...

    def projected_loss(
        self, h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, bias: Tensor | None, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        """The label-smoothed loss of the logits ``h @ weight.T + bias`` (:func:`transformer_mt.model.loss.
        label_smoothed_nll_loss`): h (N, D), weight (V, D), bias (V,) or None, target (N,) -> (loss_sum, nll_sum),
        float32 scalars, without a host sync. ``epsilon`` is checked by the caller."""
        ...


def choose_ops(name: str = "auto", device: torch.device | str = "cpu", *, setting: str = "ops") -> Ops:
    """The backend ``name`` (one of :data:`OPS_CHOICES`) for a model on ``device``; ``auto``: ``cpu`` on a CPU,
    ``cuda`` elsewhere. A backend that cannot run on the device is refused (ConfigError naming ``setting``, the
    key or argument the name came from)."""
    kind = torch.device(device).type
    if name == "auto":
        name = "cpu" if kind == "cpu" else "cuda"
    if name not in OPS_CHOICES:
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise ConfigError(f"{setting}={shown!r} is not one of {', '.join(OPS_CHOICES)}; use auto")
    if name == "reference":
        from transformer_mt.model.ops.reference import ReferenceOps

        return ReferenceOps()
    if (name == "cpu") != (kind == "cpu"):
        raise ConfigError(f"{setting}={name!r} does not run on a {kind} device; use auto (or reference)")
    if name == "cpu":
        from transformer_mt.model.ops.cpu import CpuOps

        return CpuOps()
    from transformer_mt.model.ops.cuda import CudaOps

    return CudaOps()
