"""The tensor shapes of a batch through the real modules, as `tmt inspect` prints them and `tmt explore` shows them.

While the body of :func:`traced` runs (one batch through ``encode`` and ``decode``), forward hooks on every
submodule record its input -> output shape, and each :class:`~transformer_mt.model.MultiHeadAttention`'s
``attend`` call is wrapped to read Q, K, V per head, the attention mask and the score matrix (B, H, queries,
keys). Nothing is re-implemented, so the shapes are what the model computes.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch import nn

from transformer_mt.model import MultiHeadAttention, Transformer


def describe(module: nn.Module) -> str:
    """One module in a few words: its class and sizes (``Linear(32 -> 64)``, ``MultiHeadAttention(4 heads, ...)``)."""
    if isinstance(module, nn.Embedding):
        return f"Embedding({module.num_embeddings}, {module.embedding_dim})"
    if isinstance(module, nn.Linear):
        return f"Linear({module.in_features} -> {module.out_features}{'' if module.bias is not None else ', no bias'})"
    if isinstance(module, nn.LayerNorm):
        return f"LayerNorm({module.normalized_shape[0]})"
    if isinstance(module, MultiHeadAttention):
        return f"MultiHeadAttention({module.heads} heads, d_k {module.dk}, d_v {module.dv})"
    if isinstance(module, nn.ModuleList):
        return f"ModuleList x{len(module)}"
    return type(module).__name__


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else "-"


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):  # layer outputs (x, weights), EncoderOut(memory, src_pad)
        return next((t for t in map(_first_tensor, x) if t is not None), None)
    return None


def _symbols(name: str) -> tuple[str, str]:
    """Query and key length letters of an attention module from its place in the tree."""
    if name.startswith("encoder"):
        return "S", "S"
    return ("T", "S") if name.endswith("cross_attn") else ("T", "T")


@contextlib.contextmanager
def traced(model: Transformer):
    """Record shapes while the body runs: {module name: ["in -> out", ...]} and {mha name: [detail lines]}."""
    calls: dict[str, list[str]] = defaultdict(list)
    details: dict[str, list[str]] = defaultdict(list)
    handles, wrapped = [], []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(_mod: nn.Module, args: object, out: object, name: str = name) -> None:
            calls[name].append(f"{_shape(_first_tensor(args))} -> {_shape(_first_tensor(out))}")

        handles.append(module.register_forward_hook(hook))
        if isinstance(module, MultiHeadAttention):
            wrapped.append(module)
            module.attend = _recording_attend(module, name, details[name])  # type: ignore[method-assign] # restored below
    try:
        yield calls, details
    finally:
        for h in handles:
            h.remove()
        for module in wrapped:
            del module.attend  # the class's method again


def _recording_attend(module: MultiHeadAttention, name: str, lines: list[str]):
    real = type(module).attend.__get__(module)
    tq, tk = _symbols(name)

    def attend(q, k, v, allowed=None, *args, **kwargs):
        out = real(q, k, v, allowed, *args, **kwargs)
        b, h, nq, _ = q.shape
        if allowed is not None:
            mask = f"allowed {_shape(allowed)} bool, True = attend" + (
                " (causal + padding)" if (tq, tk) == ("T", "T") else ""
            )
        else:  # SDPA's is_causal: the causal pattern without a mask tensor
            mask = "causal (is_causal, no mask tensor)" if kwargs.get("causal") else "none (no padding to hide)"
        lines.append(
            f"Q (B, H, {tq}, Dk) = {_shape(q)}   K (B, H, {tk}, Dk) = {_shape(k)}   V (B, H, {tk}, Dv) = {_shape(v)}"
        )
        lines.append(f"scores softmax(QK^T/sqrt(Dk)) (B, H, {tq}, {tk}) = {(b, h, nq, k.size(-2))}   mask {mask}")
        lines.append(f"heads concatenated (B, {tq}, H*Dv) = {(b, nq, h * v.size(-1))} -> out")
        return out

    return attend
