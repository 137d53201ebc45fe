"""The encoder and decoder layers (section 3.1): attention and feed-forward sublayers with their residual
wiring, post- or pre-norm as ``model.norm`` says (:mod:`transformer_mt.model.norms`); the decoder layer also as one
step of incremental decoding over its cache (:meth:`DecoderLayer.step`).

Shapes: B batch, S source length, T target length, D d_model, H heads, Dk / Dv key / value size per head, R rows
of a decoding step, G groups of rows (a sentence's beams). Masks follow :mod:`transformer_mt.model.attention`
(attention masks: True = attend). The products, dropout and attention are computed by the model's backend (``ops``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar, overload

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.linear import Linear
from transformer_mt.model.norms import is_pre_norm, norm_layer
from transformer_mt.model.ops import Ops
from transformer_mt.model.static_cache import StaticDecoderCache

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


class LayerAttention(NamedTuple):
    """Attention weights of one decoder layer (heads kept apart), as :class:`DecoderLayer` returns them when asked."""

    self_attn: Tensor  # (B, H, T, T), exactly 0 on future and padding keys
    cross_attn: Tensor  # (B, H, T, S), exactly 0 on source padding


# model.activation: relu (section 3.3), gelu (exact, erf), swish = SiLU x * sigmoid(x) (MarianMT's "swish")
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """Section 3.3: FFN(x) = act(x W1 + b1) W2 + b2, inner size d_ff; activation dropout after act."""

    def __init__(self, cfg: ModelConfig, *, ops: Ops):
        super().__init__()
        self.ops = ops
        self.fc1 = Linear(cfg.d_model, cfg.d_ff, ops=ops)
        self.fc2 = Linear(cfg.d_ff, cfg.d_model, ops=ops)
        self.act = ACTIVATIONS[cfg.activation]
        self.dropout = cfg.activation_dropout

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        if self.act is F.relu:  # one call, so that a backend may fuse the ReLU into the product
            hidden = self.ops.linear_relu(x, self.fc1.weight, self.fc1.bias)
        else:
            hidden = self.act(self.fc1(x))
        return self.fc2(self.ops.dropout(hidden, self.dropout, self.training))


class _Block(nn.Module):
    """Residual wiring shared by both layer kinds: post-norm LayerNorm(x + Dropout(f(x))) (sections 3.1, 5.4)
    or pre-norm x + Dropout(f(Norm(x))) (norm pre: LayerNorm; norm scale: ScaleNorm)."""

    def __init__(self, cfg: ModelConfig, *, ops: Ops):
        super().__init__()
        self.ops = ops
        self.pre = is_pre_norm(cfg)
        self.dropout = cfg.dropout

    def _add(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        x = self.ops.residual_dropout(x, y, self.dropout, self.training)  # P_drop on each sublayer output, then add
        return x if self.pre else norm(x)


class EncoderLayer(_Block):
    """Self-attention, then FFN; (B, S, D) -> (B, S, D)."""

    def __init__(self, cfg: ModelConfig, *, ops: Ops):
        super().__init__(cfg, ops=ops)
        self.self_attn, self.ffn = MultiHeadAttention(cfg, ops=ops), FeedForward(cfg, ops=ops)
        self.norm1, self.norm2 = norm_layer(cfg, ops=ops), norm_layer(cfg, ops=ops)

    def forward(self, x: Tensor, allowed: Tensor | None, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``allowed``: (B, 1, 1, S) bool, True = attend (the source key-padding mask), None without padding. Returns
        the layer's output (B, S, D) and, with ``need_weights``, its self-attention weights (B, H, S, S), else None."""
        h = self.norm1(x) if self.pre else x
        h, weights = self.self_attn.attend(*self.self_attn.project_qkv(h), allowed, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        return self._add(x, self.ffn(h), self.norm2), weights


class DecoderLayer(_Block):
    """Masked self-attention, cross-attention over the encoder output, then FFN; (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig, *, ops: Ops):
        super().__init__(cfg, ops=ops)
        self.self_attn = MultiHeadAttention(cfg, ops=ops)
        self.cross_attn = MultiHeadAttention(cfg, ops=ops)
        self.ffn = FeedForward(cfg, ops=ops)
        self.norm1, self.norm2, self.norm3 = (norm_layer(cfg, ops=ops) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        *,
        self_allowed: Tensor | None,
        cross_allowed: Tensor | None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, LayerAttention | None]:
        """Teacher forcing: x (B, T, D); cross_k/v (B, H, S, Dk|Dv) from the encoder output; masks bool, True =
        attend: ``self_allowed`` (B, 1, T, T) causal + padding, or None with ``causal`` (causal only, right-padded
        x), ``cross_allowed`` (B, 1, 1, S), None when the source has no padding. Returns the layer's output (B, T, D)
        and, with ``need_weights``, its attention weights, else None."""
        h = self.norm1(x) if self.pre else x
        q, k, v = self.self_attn.project_qkv(h)
        h, self_w = self.self_attn.attend(q, k, v, self_allowed, causal=causal, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        q = self.cross_attn.project_q(h)
        h, cross_w = self.cross_attn.attend(q, cross_k, cross_v, cross_allowed, need_weights=need_weights)
        x = self._add(x, h, self.norm2)
        h = self.norm3(x) if self.pre else x
        x = self._add(x, self.ffn(h), self.norm3)
        if not need_weights:
            return x, None
        assert self_w is not None and cross_w is not None  # attend returns the weights it was asked for
        return x, LayerAttention(self_w, cross_w)

    def step(self, x: Tensor, cache: DecoderCache | StaticDecoderCache, layer: int) -> Tensor:
        """One position of incremental decoding: x (R, 1, D), the newest position of each row -> (R, 1, D). Its
        self-attention K/V are written to ``cache`` (layer ``layer``) and the query sees every cached position in its
        past: a growing cache holds only those (no mask), a static one all T, masked by ``cache.self_allowed``; a
        sentence's beams query its one copy of the encoder output together."""
        h = self.norm1(x) if self.pre else x
        q, k, v = self.self_attn.project_qkv(h)
        k, v = cache.update(layer, k, v)  # (R, H, length + 1, Dk|Dv), or (R, H, T, Dk|Dv) static
        x = self._add(x, self.self_attn.attend_cache(q, k, v, cache.self_allowed), self.norm1)
        h = self.norm2(x) if self.pre else x
        q = self.cross_attn.project_q(h.reshape(-1, cache.group, h.size(-1)))  # (R, 1, D) -> (G, H, group, Dk)
        h = self.cross_attn.attend_source(q, cache.cross_k[layer], cache.cross_v[layer], cache.cross_allowed)
        x = self._add(x, h.reshape(x.shape), self.norm2)  # (G, group, D) -> (R, 1, D)
        h = self.norm3(x) if self.pre else x
        return self._add(x, self.ffn(h), self.norm3)
