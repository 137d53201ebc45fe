"""The encoder and decoder layers (section 3.1): attention and feed-forward sublayers with their residual
wiring, post- or pre-norm as ``model.norm`` says (:mod:`transformer_mt.model.norms`).

Shapes: B batch, S source length, T target length, D d_model, H heads, Dk / Dv key / value size per head.
Masks follow :mod:`transformer_mt.model.attention` (attention masks: True = attend).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.kernels import Linear, dropout, linear_relu, residual_dropout
from transformer_mt.model.norms import is_pre_norm, norm_layer

M = TypeVar("M", bound=nn.Module)

if TYPE_CHECKING:

    class TypedModuleList(nn.ModuleList, Generic[M]):
        """An nn.ModuleList of one module type, as the type checker sees it: its items are Ms, not Modules."""

        def __init__(self, modules: Iterable[M]) -> None: ...
        def __iter__(self) -> Iterator[M]: ...
        @overload
        def __getitem__(self, idx: slice) -> TypedModuleList[M]: ...
        @overload
        def __getitem__(self, idx: int) -> M: ...
        def __getitem__(self, idx: slice | int) -> TypedModuleList[M] | M: ...

else:
    TypedModuleList = nn.ModuleList  # at run time the plain container: the same modules, names and repr


# A decoding step over at least this many rows spells its attention out (below): SDPA's CPU flash kernel works
# in blocks sized for long sequences, and one query per row over a few dozen keys leaves them nearly empty.
# Fewer rows (one sentence) keep SDPA, whose single call costs less than the spelled-out ops' dispatch.
STEP_SPELLED_OUT_ROWS = 32


def _step_self_attention(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Self-attention of a decoding step, softmax(q k^T / sqrt(Dk)) v then W^O, over the cache's time-major
    buffers as they are: q (R, H, 1, Dk), k (R, H, T, Dk), v (R, H, T, Dv) (views of (T, R, H, D) buffers,
    :meth:`DecoderCache.update`) -> (R, 1, D). Every cached position is in the query's past: no mask."""
    keys, values = k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)  # (R, H, T, D) -> (T, R, H, D), contiguous
    scores = (keys * (q[:, :, 0] * attn.dk**-0.5)).sum(-1)  # (T, R, H); section 3.2.1 scaling
    out = (scores.softmax(dim=0).unsqueeze(-1) * values).sum(0)  # (T, R, H, 1) * (T, R, H, Dv) -> (R, H, Dv)
    return attn.out(out.reshape(out.size(0), 1, -1))  # (R, H, Dv) -> (R, 1, H*Dv) -> (R, 1, D)


def _step_cross_attention(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """Cross-attention of a decoding step as two batched matmuls and a softmax, then W^O: q (G, H, group, Dk)
    (a sentence's beams as its query positions), k (G, H, S, Dk), v (G, H, S, Dv), ``allowed`` (G, 1, 1, S)
    True = attend, or None -> (G, group, D)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * attn.dk**-0.5  # (G, H, group, S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # allowed_mask leaves every row a key: no NaN
    out = torch.matmul(scores.softmax(dim=-1), v)  # (G, H, group, Dv)
    return attn.out(out.transpose(1, 2).reshape(q.size(0), q.size(2), -1))  # (G, group, H*Dv) -> (G, group, D)


class LayerAttention(NamedTuple):
    """Attention weights of one decoder layer (heads kept apart), as :class:`DecoderLayer` returns them when asked."""

    self_attn: Tensor  # (B, H, T, T), exactly 0 on future and padding keys
    cross_attn: Tensor  # (B, H, T, S), exactly 0 on source padding


# model.activation: relu (section 3.3), gelu (exact, erf), swish = SiLU x * sigmoid(x) (MarianMT's "swish")
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """Section 3.3: FFN(x) = act(x W1 + b1) W2 + b2, inner size d_ff; activation dropout after act."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = Linear(cfg.d_ff, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]
        self.dropout = cfg.activation_dropout

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        if self.act is F.relu:  # the ReLU as the product's post-op where the product runs through oneDNN
            hidden = linear_relu(x, self.fc1.weight, self.fc1.bias)
        else:
            hidden = self.act(self.fc1(x))
        return self.fc2(dropout(hidden, self.dropout, self.training))


class _Block(nn.Module):
    """Residual wiring shared by both layer kinds: post-norm LayerNorm(x + Dropout(f(x))) (sections 3.1, 5.4)
    or pre-norm x + Dropout(f(Norm(x))) (norm pre: LayerNorm; norm scale: ScaleNorm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = is_pre_norm(cfg)
        self.dropout = cfg.dropout

    def _add(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        x = residual_dropout(x, y, self.dropout, self.training)  # P_drop on each sublayer output, before the add
        return x if self.pre else norm(x)


class EncoderLayer(_Block):
    """Self-attention, then FFN; (B, S, D) -> (B, S, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn, self.ffn = MultiHeadAttention(cfg), FeedForward(cfg)
        self.norm1, self.norm2 = norm_layer(cfg), norm_layer(cfg)

    def forward(self, x: Tensor, allowed: Tensor | None, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``allowed``: (B, 1, 1, S) bool, True = attend (the source key-padding mask), None without padding. Returns the layer's
        output (B, S, D) and, with ``need_weights``, its self-attention weights (B, H, S, S), else None."""
        h = self.norm1(x) if self.pre else x
        h, weights = self.self_attn.attend(*self.self_attn.project_qkv(h), allowed, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        return self._add(x, self.ffn(h), self.norm2), weights


class DecoderLayer(_Block):
    """Masked self-attention, cross-attention over the encoder output, then FFN; (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn, self.cross_attn, self.ffn = MultiHeadAttention(cfg), MultiHeadAttention(cfg), FeedForward(cfg)
        self.norm1, self.norm2, self.norm3 = (norm_layer(cfg) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        *,
        self_allowed: Tensor | None,
        cross_allowed: Tensor | None,
        causal: bool = False,
        cache: DecoderCache | None = None,
        layer: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, LayerAttention | None]:
        """x (B, T, D); cross_k/v (B, H, S, Dk|Dv) from the encoder output; masks bool, True = attend:
        ``self_allowed`` (B, 1, T, T) causal + padding, or None with ``causal`` (causal only, right-padded x),
        ``cross_allowed`` (B, 1, 1, S), None when the source has no padding.
        With ``cache`` (incremental decoding, x holds only the new positions), this layer's self-attention
        K/V are appended to the cache and the queries see every cached position, so no mask is needed."""
        h = self.norm1(x) if self.pre else x
        q, k, v = self.self_attn.project_qkv(h)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, length + T, Dk|Dv)
        spelled = cache is not None and not need_weights and q.size(0) >= STEP_SPELLED_OUT_ROWS
        if spelled:
            h, self_w = _step_self_attention(self.self_attn, q, k, v), None
        else:
            h, self_w = self.self_attn.attend(q, k, v, self_allowed, causal=causal, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        if spelled:
            assert cache is not None
            q = self.cross_attn.project_q(h.reshape(-1, cache.group, h.size(-1)))  # (R, 1, D) -> (G, H, group, Dk)
            h, cross_w = (
                _step_cross_attention(self.cross_attn, q, cross_k, cross_v, cross_allowed).reshape(x.shape),
                None,
            )
        elif cache is not None and cache.group > 1:
            # A sentence's beams query its one copy of the encoder output as `group` query positions:
            # (R, 1, D) -> (G, group, D) -> attend -> (R, 1, D).
            h, cross_w = self.cross_attn.attend(
                self.cross_attn.project_q(h.reshape(-1, cache.group, h.size(-1))), cross_k, cross_v, cross_allowed
            )
            h = h.reshape(x.shape)
        else:
            h, cross_w = self.cross_attn.attend(
                self.cross_attn.project_q(h), cross_k, cross_v, cross_allowed, need_weights=need_weights
            )
        x = self._add(x, h, self.norm2)
        h = self.norm3(x) if self.pre else x
        x = self._add(x, self.ffn(h), self.norm3)
        if not need_weights:
            return x, None
        assert self_w is not None and cross_w is not None  # attend returns the weights it was asked for
        return x, LayerAttention(self_w, cross_w)
