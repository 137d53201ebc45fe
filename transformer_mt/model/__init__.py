"""The Transformer: attention, layers, norms, positions, the output layer, the KV caches (growing and static), the loss
and ensembles; and ``ops``, the interface to the fast paths and the choice of the backend (reference, cpu, cuda) a
model computes with."""

from transformer_mt.model.attention import BlockDiagonal, MultiHeadAttention, Segments, allowed_mask
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.ensemble import Ensemble, EnsembleCache
from transformer_mt.model.lora import (
    LoRA,
    LoraError,
    adapter_weights,
    add_lora,
    is_adapter_name,
    merge_lora_weights,
)
from transformer_mt.model.loss import (
    Packing,
    TeacherForcedLoss,
    label_smoothed_nll_loss,
    perplexity,
    projected_label_smoothed_loss,
)
from transformer_mt.model.norms import LayerNorm, ScaleNorm, fixnorm
from transformer_mt.model.ops import OPS_CHOICES, Ops, choose_ops
from transformer_mt.model.positions import sinusoids
from transformer_mt.model.static_cache import StaticBuffers, StaticDecoderCache
from transformer_mt.model.transformer import (
    AttentionWeights,
    EncoderOut,
    PackedEncoderOut,
    Transformer,
    count_parameters,
)

__all__ = [
    "OPS_CHOICES",
    "AttentionWeights",
    "BlockDiagonal",
    "DecoderCache",
    "EncoderOut",
    "Ensemble",
    "EnsembleCache",
    "LayerNorm",
    "LoRA",
    "LoraError",
    "MultiHeadAttention",
    "Ops",
    "PackedEncoderOut",
    "Packing",
    "ScaleNorm",
    "Segments",
    "StaticBuffers",
    "StaticDecoderCache",
    "TeacherForcedLoss",
    "adapter_weights",
    "add_lora",
    "Transformer",
    "allowed_mask",
    "choose_ops",
    "count_parameters",
    "fixnorm",
    "is_adapter_name",
    "label_smoothed_nll_loss",
    "merge_lora_weights",
    "perplexity",
    "projected_label_smoothed_loss",
    "sinusoids",
]
