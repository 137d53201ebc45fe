"""``Linear``: ``nn.Linear`` (same parameters, same state dict) whose product is the model's ``ops.linear``."""

from __future__ import annotations

from torch import Tensor, nn

from transformer_mt.model.ops import Ops


class Linear(nn.Linear):
    """``nn.Linear(in_features, out_features)`` computed by ``ops`` (the model's backend, :meth:`Transformer.use_ops`
    replaces it); a module, so that forward hooks see it as they see any layer."""

    def __init__(self, in_features: int, out_features: int, *, ops: Ops):
        super().__init__(in_features, out_features)
        self.ops = ops

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        return self.ops.linear(x, self.weight, self.bias)
