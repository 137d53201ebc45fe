"""The position vectors a model adds to its embeddings (sinusoids, section 3.5, or a learned table)."""

from __future__ import annotations

import torch


def position_table(model, length: int) -> torch.Tensor:
    """The model's own position vectors for positions [0, length): (length, D) float32 on CPU."""
    with torch.no_grad():
        return model._positions(0, length).detach().float().cpu()
