"""The Transformer: layers, norms, positions, the output projection, the KV cache, kernels, loss and ensembles."""

from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.ensemble import Ensemble
from transformer_mt.model.kernels import dropout
from transformer_mt.model.loss import TeacherForcedLoss, label_smoothed_nll_loss, perplexity, projected_label_smoothed_loss
from transformer_mt.model.transformer import MultiHeadAttention, ScaleNorm, Transformer, count_parameters, sinusoids

__all__ = [
    "DecoderCache",
    "Ensemble",
    "MultiHeadAttention",
    "ScaleNorm",
    "TeacherForcedLoss",
    "Transformer",
    "count_parameters",
    "dropout",
    "label_smoothed_nll_loss",
    "perplexity",
    "projected_label_smoothed_loss",
    "sinusoids",
]
