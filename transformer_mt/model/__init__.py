"""The Transformer: attention, layers, norms, positions, the output layer, the KV cache, kernels (and their C++ build,
``native``), loss and ensembles."""

from transformer_mt.model import native
from transformer_mt.model.attention import MultiHeadAttention, allowed_mask
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.ensemble import Ensemble
from transformer_mt.model.kernels import dropout, use_reference_ops
from transformer_mt.model.loss import (
    TeacherForcedLoss,
    label_smoothed_nll_loss,
    perplexity,
    projected_label_smoothed_loss,
)
from transformer_mt.model.norms import LayerNorm, ScaleNorm, fixnorm
from transformer_mt.model.positions import sinusoids
from transformer_mt.model.transformer import AttentionWeights, EncoderOut, Transformer, count_parameters

__all__ = [
    "AttentionWeights",
    "DecoderCache",
    "EncoderOut",
    "Ensemble",
    "LayerNorm",
    "MultiHeadAttention",
    "ScaleNorm",
    "TeacherForcedLoss",
    "Transformer",
    "allowed_mask",
    "count_parameters",
    "dropout",
    "fixnorm",
    "label_smoothed_nll_loss",
    "native",
    "perplexity",
    "projected_label_smoothed_loss",
    "sinusoids",
    "use_reference_ops",
]
