"""The reference backend: each operation of :class:`~transformer_mt.model.ops.Ops` as its formula in plain torch.

These are the numbers every other backend is tested against (tests/model/test_ops.py), and what ``train.ops:
reference`` trains with: ``F.linear``, ``F.dropout``, ScaleNorm's formula under autograd, ``F.normalize``, SDPA (or,
when the weights are asked for, softmax(q k^T / sqrt(Dk)) v spelled out), and the logits followed by
:func:`~transformer_mt.model.label_smoothing.label_smoothed_sums`. A faster backend subclasses :class:`ReferenceOps` and
falls back to it wherever its own kernels do not apply.

Where one operation is made of others (``residual_dropout`` is ``x + self.dropout(y)``, ``linear_relu`` is the ReLU
of ``self.linear``, a decoding step is ``self.attention``), it calls the backend's own, so that a subclass's
fallback keeps its other fast paths. :meth:`ReferenceOps.sdpa` is the one call of SDPA, for a backend that pins
its kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.model.label_smoothing import label_smoothed_sums


def join_heads(out: Tensor) -> Tensor:
    """Attention outputs (B, H, T, Dv) -> (B, T, H * Dv), the heads side by side as W^O takes them."""
    b, h, t, dv = out.shape
    return out.transpose(1, 2).reshape(b, t, h * dv)  # (B, H, T, Dv) -> (B, T, H, Dv) -> (B, T, H*Dv)


def grid_rows(cu_seqlens: Tensor, total: int, max_len: int) -> Tensor:
    """The row of each packed token in a (B * max_len) grid of its sentences right-padded to ``max_len``: sentence b's
    token j at b * max_len + j. ``cu_seqlens`` (B + 1,) cumulative lengths, ``total`` their sum (a shape: no host
    sync) -> (total,) long."""
    starts = cu_seqlens.long()  # (B + 1,)
    sentence = torch.repeat_interleave(
        torch.arange(starts.numel() - 1, device=starts.device), starts[1:] - starts[:-1], output_size=total
    )  # (total,): the sentence of each token
    return sentence * max_len + torch.arange(total, device=starts.device) - starts[sentence]


class ReferenceOps:
    """Plain torch for every operation (the module's docstring)."""

    name = "reference"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ---------------------------------------------------------------- products
    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.linear(x, weight, bias)

    def linear_relu(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.relu(self.linear(x, weight, bias))

    def output_linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        return F.linear(x, weight, bias)

    # ---------------------------------------------------------------- dropout
    def dropout(self, x: Tensor, p: float, training: bool) -> Tensor:
        if not training or p == 0.0:  # x itself: no mask drawn, no generator state used
            return x
        return F.dropout(x, p, True)

    def residual_dropout(self, x: Tensor, y: Tensor, p: float, training: bool) -> Tensor:
        return x + self.dropout(y, p, training)

    # ---------------------------------------------------------------- norms
    def scale_norm(self, x: Tensor, g: Tensor, eps: float) -> Tensor:
        return x * (g / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=eps))

    def normalize(self, x: Tensor, eps: float) -> Tensor:
        return F.normalize(x, dim=-1, eps=eps)

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
        if need_weights:
            out, weights = self.spelled_out(q, k, v, allowed, causal=causal, dropout_p=dropout_p)
            return join_heads(out), weights
        return join_heads(self.sdpa(q, k, v, allowed, causal=causal, dropout_p=dropout_p)), None

    def spelled_out(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, dropout_p: float
    ) -> tuple[Tensor, Tensor]:
        """softmax(q k^T / sqrt(Dk)) v as two batched matmuls and a softmax: (B, H, T, Dv) and the weights (B, H, T,
        K) before dropout; blocked keys get -inf before the softmax, so exactly 0 after it."""
        scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, H, T, K); section 3.2.1 scaling
        if causal:  # section 3.2.3: position i sees positions <= i
            allowed = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(dim=-1)
        return self.dropout(weights, dropout_p, True) @ v, weights  # (B, H, T, Dv); dropout_p is 0 outside training

    def sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool, dropout_p: float
    ) -> Tensor:
        """``F.scaled_dot_product_attention`` (scale 1/sqrt(Dk)) -> (B, H, T, Dv)."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=causal)

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
        """The packed sentences padded into a (B, max, H, D) grid, attended by :meth:`attention` (the backend's own)
        with a key-padding mask, and gathered back: the numbers of attending each sentence alone, at the cost of the
        padded batch. Causal needs no mask: a real query's past holds no padding (padding is at each row's end)."""
        b = cu_q.numel() - 1
        at_q, at_k = grid_rows(cu_q, q.size(0), max_q), grid_rows(cu_k, k.size(0), max_k)  # (Nq,), (Nk,)
        h = q.size(1)

        def padded(x: Tensor, rows: Tensor, length: int) -> Tensor:  # (N, H, D) -> (B, H, length, D), zeros between
            grid = x.new_zeros(b * length, h, x.size(-1)).index_copy(0, rows, x)
            return grid.view(b, length, h, -1).transpose(1, 2)  # (B*L, H, D) -> (B, L, H, D) -> (B, H, L, D)

        allowed = None
        if not causal:  # (B, 1, 1, max_k), True on each sentence's keys
            lengths = (cu_k[1:] - cu_k[:-1]).long()  # (B,)
            allowed = (torch.arange(max_k, device=k.device) < lengths[:, None])[:, None, None, :]
        out, _ = self.attention(
            padded(q, at_q, max_q),
            padded(k, at_k, max_k),
            padded(v, at_k, max_k),
            allowed,
            causal=causal,
            dropout_p=dropout_p,
            need_weights=False,
        )  # (B, max_q, H * Dv)
        return out.reshape(b * max_q, h, -1).index_select(0, at_q)  # (B*max_q, H, Dv) -> (Nq, H, Dv)

    def self_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, allowed: Tensor | None = None
    ) -> Tensor:
        return self.attention(q, k, v, allowed, causal=False, dropout_p=dropout_p, need_weights=False)[0]

    def cross_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, dropout_p: float
    ) -> Tensor:
        return self.attention(q, k, v, allowed, causal=False, dropout_p=dropout_p, need_weights=False)[0]

    # ---------------------------------------------------------------- the loss
    def projected_loss(
        self, h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, bias: Tensor | None, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        logits = F.linear(h, weight, bias)  # (N, V)
        return label_smoothed_sums(logits, target, epsilon=epsilon, ignore_index=ignore_index)
