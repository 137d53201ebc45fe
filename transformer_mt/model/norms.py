"""Normalisation: where it sits (``model.norm``) and what it computes (LayerNorm, ScaleNorm, FixNorm).

``model.norm`` picks one of three arrangements:

* ``post``, the paper's: LayerNorm after each residual add, LayerNorm(x + Dropout(f(x))) (sections 3.1, 5.4);
* ``pre``: LayerNorm on each sublayer's input, x + Dropout(f(LayerNorm(x))), plus one final LayerNorm per
  stack (the residual stream is otherwise never normalised);
* ``scale``, "Transformers without Tears" (Nguyen & Salazar 2019) as the authors' code
  (tnq177/transformers_without_tears) runs it: pre placement with :class:`ScaleNorm`
  g * x / max(||x||_2, 1e-5) (one learned scalar g per norm, initialised to sqrt(d_model)) in place of every
  LayerNorm, and :func:`fixnorm`: every word-embedding row is l2-normalised to length 1 before the
  sqrt(d_model) input scale, so the input embeddings have the fixed length sqrt(d_model) (the paper's fixed
  g), and the output layer scores with the normalised rows too (tied: the same matrix; untied: its own
  rows), so a logit is the final ScaleNorm's g times a cosine. Only the rows' directions are learned; the
  PAD row stays 0.

Both norm layers normalise in their parameters' dtype (float32) when the input has another, so that weights
cast to bfloat16 / float16 for inference (:meth:`Transformer.cast_weights`) keep the norms exact. ScaleNorm and
FixNorm are computed by the model's backend (``ops.scale_norm``, ``ops.normalize``); LayerNorm is torch's own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.ops import Ops, choose_ops


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters, same state dict) that normalises in its parameters' dtype when the
    input has another: weights cast to bfloat16 / float16 for inference (:meth:`Transformer.cast_weights`)
    keep the norms in float32, where the mean and variance of a 512-wide row do not lose 8 bits."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype:
            return super().forward(x)
        return F.layer_norm(x.to(self.weight.dtype), self.normalized_shape, self.weight, self.bias, self.eps).to(
            x.dtype
        )


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, eq. 5): (..., D) -> g * x / max(||x||_2, eps) over the last dimension, one
    learned scalar ``g`` initialised to sqrt(D) (x / ||x|| * sqrt(D) has unit RMS, as LayerNorm's output has).
    Like :class:`LayerNorm`, it normalises in g's dtype (float32) when the input has another. Computed by ``ops``, the
    model's backend (None: the CPU's ``auto``)."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, ops: Ops | None = None):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(math.sqrt(d_model)))  # () scalar; the authors' initial value
        self.d_model, self.eps = d_model, eps
        self.ops = ops if ops is not None else choose_ops()

    def forward(self, x: Tensor) -> Tensor:
        return self.ops.scale_norm(x.to(self.g.dtype), self.g, self.eps).to(x.dtype)


_NORMALIZE_EPS = 1e-12  # F.normalize's


def fixnorm(rows: Tensor, *, ops: Ops) -> Tensor:
    """FixNorm (Nguyen & Chiang 2018, as "Transformers without Tears" uses it): (..., D) rows l2-normalised
    to length 1 over the last dimension (a zero row, PAD's, stays 0), ``F.normalize``'s formula, by ``ops``."""
    return ops.normalize(rows, _NORMALIZE_EPS)


def norm_layer(cfg: ModelConfig, *, ops: Ops) -> nn.Module:
    """The normalisation layer ``model.norm`` asks for: ScaleNorm (computed by ``ops``) for scale, else LayerNorm."""
    return ScaleNorm(cfg.d_model, ops=ops) if cfg.norm == "scale" else LayerNorm(cfg.d_model)


def is_pre_norm(cfg: ModelConfig) -> bool:
    """Whether each sublayer normalises its input (pre, scale) rather than the residual sum (post)."""
    return cfg.norm in ("pre", "scale")
