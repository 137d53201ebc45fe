"""The CPU package's device-generic paths, shared by the cpu backend and (until it brings its own kernels) the cuda
backend: a decoding step's attention spelled out over at least ``STEP_SPELLED_OUT_ROWS`` rows, and the vocabulary
projection fused with the loss in row chunks."""

from __future__ import annotations

from torch import Tensor

from transformer_mt.model.ops.cpu.attention import STEP_SPELLED_OUT_ROWS, step_cross_attention, step_self_attention
from transformer_mt.model.ops.cpu.fused_loss import projected_sums
from transformer_mt.model.ops.reference import ReferenceOps


class GenericFastPaths(ReferenceOps):
    """:class:`ReferenceOps` with the decoding step and the projected loss that any device runs faster."""

    step_spelled_out_rows = STEP_SPELLED_OUT_ROWS  # the fewest rows a decoding step's attention spells out

    def self_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, allowed: Tensor | None = None
    ) -> Tensor:
        if q.size(0) < self.step_spelled_out_rows:
            return super().self_attention_step(q, k, v, dropout_p=dropout_p, allowed=allowed)
        return step_self_attention(q, k, v, allowed)

    def cross_attention_step(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, dropout_p: float
    ) -> Tensor:
        if q.size(0) * q.size(2) < self.step_spelled_out_rows:  # G groups of `group` rows
            return super().cross_attention_step(q, k, v, allowed, dropout_p=dropout_p)
        return step_cross_attention(q, k, v, allowed)

    def projected_loss(
        self, h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, bias: Tensor | None, ignore_index: int
    ) -> tuple[Tensor, Tensor]:
        return projected_sums(h, weight, target, epsilon=epsilon, bias=bias, ignore_index=ignore_index)
