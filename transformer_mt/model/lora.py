"""Low-rank adapters (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A projection ``y = W x + b`` with an adapter computes ``y = W x + b + (alpha / r) B A dropout(x)``: A (r, in), B (out,
r), r the rank. A starts like ``nn.Linear``'s weight (Kaiming-uniform) and B at zero (section 4.1 of the paper), so
an adapted model computes exactly what its base does until the first update. The base weights are frozen and keep
their dtype; only A and B train.

:func:`add_lora` adapts a built :class:`~transformer_mt.model.Transformer` in place, so that the model files state
their equations once, without adapters: each adapted module becomes its LoRA subclass here (same parameters, same
state-dict names, plus ``lora``), whose forward is the base product through ``ops`` plus the low-rank path. The
names users give (``train.lora.targets``) are the projections of the paper's notation: ``q``, ``k``, ``v`` (rows of
attention's fused ``in_weight``, each with its own adapter), ``o`` (W^O), ``ffn1``, ``ffn2``.

Stored adapters are the entries whose name holds a ``lora`` part (``encoder.0.self_attn.lora.q.A``,
``decoder.1.ffn.fc2.lora.B``); :func:`merge_lora_weights` folds them into their base weights (W + alpha / r B A),
which is what decoding and export load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from transformer_mt.config import LoraConfig, ModelConfig
from transformer_mt.errors import TmtError
from transformer_mt.model.attention import MultiHeadAttention
from transformer_mt.model.layers import FeedForward
from transformer_mt.model.linear import Linear
from transformer_mt.model.ops import Ops

QKV = ("q", "k", "v")  # the rows of MultiHeadAttention.in_weight, in order


class LoraError(TmtError):
    """Adapters that do not fit the model or the checkpoint they come with."""


class LoRA(nn.Module):
    """The low-rank path of one projection: x (..., in) -> (alpha / r) B A dropout(x) (..., out)."""

    def __init__(self, in_features: int, out_features: int, *, rank: int, alpha: float, dropout: float, ops: Ops):
        super().__init__()
        self.ops = ops
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))  # zero: the adapted model starts as its base
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's own initialisation, as the paper's code does
        self.scale = alpha / rank
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        h = self.ops.dropout(x, self.dropout, self.training)
        return self.ops.linear(self.ops.linear(h, self.A), self.B) * self.scale  # (..., in) -> (..., r) -> (..., out)

    def delta_weight(self) -> Tensor:
        """(alpha / r) B A, (out, in) in float32: what merging adds to the base weight."""
        return (self.B.float() @ self.A.float()) * self.scale


class LoRALinear(Linear):
    """:class:`Linear` with an adapter: ``ops.linear(x, W, b) + lora(x)``."""

    lora: LoRA

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        return self.ops.linear(x, self.weight, self.bias) + self.lora(x)


class LoRAFeedForward(FeedForward):
    """:class:`FeedForward` whose first product has an adapter: the activation then applies to the adapted sum, so
    the fused product-and-ReLU of ``ops.linear_relu`` (which sees only W1) is not used."""

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        hidden = self.act(self.fc1(x))
        return self.fc2(self.ops.dropout(hidden, self.dropout, self.training))


class LoRAAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` with adapters on some of W^Q, W^K, W^V (``lora``: one per adapted projection,
    keyed q, k, v), each added to its rows of the one fused product."""

    lora: nn.ModuleDict

    def _adapted(self, x: Tensor, outs: tuple[Tensor, ...], names: tuple[str, ...]) -> list[Tensor]:
        """The base products ``outs`` (..., rows of each) of x, each plus its adapter's path where it has one."""
        return [y + self.lora[name](x) if name in self.lora else y for y, name in zip(outs, names)]

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention input (B, T, D) -> q, k (B, H, T, Dk), v (B, H, T, Dv)."""
        outs = self.ops.linear(x, self.in_weight, self.in_bias).split(self.sizes, dim=-1)
        q, k, v = self._adapted(x, outs, QKV)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> queries (B, H, T, Dk)."""
        n = self.sizes[0]
        (q,) = self._adapted(x, (self.ops.linear(x, self.in_weight[:n], self.in_bias[:n]),), ("q",))
        return self._split_heads(q)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) -> keys (B, H, S, Dk), values (B, H, S, Dv)."""
        n = self.sizes[0]
        outs = self.ops.linear(memory, self.in_weight[n:], self.in_bias[n:]).split(self.sizes[1:], dim=-1)
        k, v = self._adapted(memory, outs, ("k", "v"))
        return self._split_heads(k), self._split_heads(v)


def _adapter(cfg: LoraConfig, in_features: int, out_features: int, ops: Ops, like: Tensor) -> LoRA:
    lora = LoRA(in_features, out_features, rank=cfg.rank, alpha=cfg.alpha, dropout=cfg.dropout, ops=ops)
    return lora.to(device=like.device)  # float32 on the base weight's device, whatever the base's dtype


def _adapt_linear(module: Linear, cfg: LoraConfig) -> None:
    module.__class__ = LoRALinear  # in place: the module keeps its parameters and state-dict names
    module.lora = _adapter(cfg, module.in_features, module.out_features, module.ops, module.weight)


def add_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Adapters on ``cfg.targets`` of every attention and feed-forward of ``model`` (built, on its device), every
    other parameter frozen (``requires_grad`` False); returns the model. ``cfg.rank`` 0 leaves it as it is."""
    if cfg.rank == 0:
        return model
    if any(isinstance(m, LoRA) for m in model.modules()):
        raise LoraError("the model has adapters already; add them once")
    for p in model.parameters():
        p.requires_grad_(False)
    targets = set(cfg.targets)
    for module in list(model.modules()):
        if isinstance(module, MultiHeadAttention):
            adapters = {
                name: _adapter(cfg, module.in_weight.size(1), rows, module.ops, module.in_weight)
                for name, rows in zip(QKV, module.sizes)
                if name in targets
            }
            if adapters:
                module.__class__ = LoRAAttention
                module.lora = nn.ModuleDict(adapters)
            if "o" in targets:
                _adapt_linear(module.out, cfg)
        elif isinstance(module, FeedForward):
            if "ffn1" in targets:
                module.__class__ = LoRAFeedForward
                _adapt_linear(module.fc1, cfg)
            if "ffn2" in targets:
                _adapt_linear(module.fc2, cfg)
    return model


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict entry is an adapter's (A or B), not a base weight."""
    return "lora" in name.split(".")


def adapter_weights(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The adapters' entries of a state dict (A and B of each adapted projection)."""
    return {name: t for name, t in weights.items() if is_adapter_name(name)}


def merge_lora_weights(weights: Mapping[str, Tensor], model: ModelConfig, lora: LoraConfig) -> dict[str, Tensor]:
    """A state dict with its adapters folded into their base weights (W + alpha / r B A, computed in float32 and
    stored in W's dtype) and removed: the weights of the plain model that computes what the adapted one does.
    Weights without adapters come back as they are. ``model``: the architecture (the rows of q, k, v in the fused
    in_weight); ``lora``: the rank and alpha the adapters were trained with."""
    adapters = adapter_weights(weights)
    if not adapters:
        return dict(weights)
    if lora.rank == 0:
        raise LoraError(
            f"the weights hold {len(adapters)} adapter tensors but train.lora.rank is 0; the checkpoint was edited"
        )
    dk, dv = model.head_dim or model.d_model // model.heads, model.value_dim or model.d_model // model.heads
    rows = dict(zip(QKV, (model.heads * dk, model.heads * dk, model.heads * dv)))
    offsets = {"q": 0, "k": rows["q"], "v": rows["q"] + rows["k"]}
    merged = {name: t for name, t in weights.items() if not is_adapter_name(name)}
    for name in adapters:
        if not name.endswith(".A"):
            continue
        prefix, _, which = name[: -len(".A")].rpartition(".lora")  # "enc.0.self_attn" "" / ".q"; "enc.0.ffn.fc1" ""
        a, b = adapters[name], adapters.get(name[:-1] + "B")
        if b is None or a.ndim != 2 or b.ndim != 2 or a.size(0) != lora.rank or b.size(1) != lora.rank:
            raise LoraError(
                f"adapter {name[:80]} does not have rank train.lora.rank={lora.rank}; the checkpoint was edited"
            )
        delta = (b.float() @ a.float()) * (lora.alpha / lora.rank)  # (out, r) @ (r, in) -> (out, in)
        if which:  # one of attention's q, k, v: its rows of the fused in_weight
            key, start = f"{prefix}.in_weight", offsets[which.lstrip(".")]
        else:
            key, start = f"{prefix}.weight", 0
        base = merged.get(key)
        if base is None or base.size(1) != delta.size(1) or base.size(0) < start + delta.size(0):
            raise LoraError(f"adapter {name[:80]} has no base weight of its shape; the checkpoint was edited")
        out = base.clone()
        out[start : start + delta.size(0)] = (base[start : start + delta.size(0)].float() + delta).to(base.dtype)
        merged[key] = out
    return merged
