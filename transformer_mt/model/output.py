"""The output layer: the pre-softmax projection (tied to the target embedding or its own), under FixNorm
with unit-length rows, and optionally restricted to the pieces the training data can produce.

Restriction (``model.restrict_output``): the logits of the pieces in the ``output_ids`` buffer only (the
target side of the training data plus the special ids, ascending; set by :meth:`OutputLayer.restrict_output_to`,
saved in the state dict). The training loss (``TeacherForcedLoss``) works in the K kept pieces
(:meth:`OutputLayer.output_weight`, :meth:`OutputLayer.output_targets`); every entry point that returns logits
(``decode``, ``decode_step``, ``attention``) returns them over the full vocabulary with -inf at the pieces that are
not kept, so ensembles, export and callers see full-vocabulary ids. One exception, asked for explicitly: a search
may ask a decoder cache for the K kept logits only (``DecoderCache.restrict_logits``) and map the columns it picks
back to ids itself, which spares every step the scatter into (rows, V) and a log-softmax and top-k over V - K
columns that are -inf anyway. The output product is the model's ``ops.output_linear``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.norms import fixnorm
from transformer_mt.model.ops import Ops
from transformer_mt.text import SpecialIds


class StepOutput(NamedTuple):
    """The output layer as a search scores with it (:meth:`OutputLayer.step_output`), held by the decoder cache."""

    weight: Tensor  # (K or V, D): the kept rows of output_proj.weight, l2-normalised under FixNorm
    bias: Tensor | None  # (K or V,), None without model.output_bias
    ids: Tensor | None  # (K,) ascending: the full id of each row; None without model.restrict_output (row i is id i)


class OutputLayer(nn.Module):
    """The output layer of :class:`~transformer_mt.model.transformer.Transformer`, mixed into it (not a
    submodule) so that its tensors keep their checkpoint names ``output_proj.weight`` and ``output_ids``.

    The model builds ``output_proj``, a (D -> V) Linear, beside its embeddings (its weight may be tied to
    the target embedding; its bias, ``output_proj.bias``, exists only with ``model.output_bias``) and sets
    ``fix_norm`` (FixNorm scores with unit-length rows). :meth:`_init_output` sets ``tgt_vocab_size`` V and
    the buffers ``output_ids`` (K,) ascending, the kept pieces (all V until
    :meth:`restrict_output_to` sets them; a checkpoint's replace them on load, at their size), and
    ``output_index`` (V,), which maps a full id to its kept index (UNK's for a piece not kept); both None
    without ``model.restrict_output``.
    """

    output_proj: nn.Linear
    ops: Ops  # the model's backend: the output product (ops.output_linear) and FixNorm
    specials: SpecialIds
    tgt_vocab_size: int
    output_ids: Tensor | None
    output_index: Tensor | None
    fix_norm: bool

    def _init_output(self, cfg: ModelConfig, tgt_vocab_size: int) -> None:
        self.tgt_vocab_size = tgt_vocab_size
        ids = torch.arange(tgt_vocab_size) if cfg.restrict_output else None
        self.register_buffer("output_ids", ids)
        self.register_buffer("output_index", None if ids is None else ids.clone(), persistent=False)

    def restrict_output_to(self, ids: Tensor) -> None:
        """Score only the target pieces ``ids`` (any order, repeats allowed; e.g. every target id of the training
        data) and the special ids, which are always kept. Needs ``model.restrict_output``."""
        if self.output_ids is None:
            raise ValueError("restrict_output_to() needs a model built with model.restrict_output: true")
        specials = torch.tensor(self.specials.kept_ids, dtype=torch.long)
        kept = torch.unique(torch.cat([specials, ids.detach().long().flatten().cpu()]))  # (K,) ascending
        if kept[-1] >= self.tgt_vocab_size:
            raise ValueError(f"target id {int(kept[-1])} is outside the target vocabulary of {self.tgt_vocab_size}")
        self.output_ids = kept.to(self.output_ids.device)
        self._index_outputs()

    def _index_outputs(self) -> None:
        assert self.output_ids is not None
        unk = torch.searchsorted(self.output_ids, self.specials.unk)  # UNK's kept index: what a piece not kept maps to
        index = unk.expand(self.tgt_vocab_size).clone()  # (V,)
        self.output_index = index.index_copy_(
            0, self.output_ids, torch.arange(self.output_ids.numel(), device=index.device)
        )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # torch's hook signature
        # A restricted model's kept set has the checkpoint's size K, unknown when the model is built: take it.
        ids = state_dict.get(prefix + "output_ids")
        if self.output_ids is not None and ids is not None and ids.shape != self.output_ids.shape:
            self.output_ids = torch.empty_like(ids, device=self.output_ids.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.output_ids is not None:
            self._index_outputs()

    @property
    def output_size(self) -> int:
        """Rows of the output layer's matmul: K kept pieces with ``model.restrict_output``, else V (FLOP counts)."""
        return self.tgt_vocab_size if self.output_ids is None else self.output_ids.numel()

    def output_weight(self) -> Tensor:
        """The output layer's (K or V, D) matrix as the model scores with it: the kept rows of ``output_proj`` (all V
        rows without ``restrict_output``), l2-normalised under FixNorm. The training loss projects with it."""
        w = self.output_proj.weight
        if self.output_ids is not None:
            w = w.index_select(0, self.output_ids)  # (V, D) -> (K, D); backward scatters into the (tied) matrix
        return fixnorm(w, ops=self.ops) if self.fix_norm else w

    def output_bias(self) -> Tensor | None:
        """The bias added to the logits of :meth:`output_weight`'s rows, (K or V,): the kept entries of
        ``output_proj.bias`` (all V without ``restrict_output``); None without ``model.output_bias``."""
        b = self.output_proj.bias
        if b is None or self.output_ids is None:
            return b
        return b.index_select(0, self.output_ids)  # (V,) -> (K,)

    def output_targets(self, target: Tensor) -> Tensor:
        """Target ids (...) -> their rows of :meth:`output_weight`: the kept index with ``restrict_output`` (a piece
        not kept, e.g. in a validation set, is scored as UNK, the piece the model emits for what it cannot spell);
        the ids themselves without."""
        return target if self.output_index is None else self.output_index[target]

    def step_output(self) -> StepOutput:
        """The output layer's matrix and bias as :meth:`logits` computes them (FixNorm, kept rows), taken once per
        search: the weights do not change while it runs, so no step needs to normalise and gather them again."""
        return StepOutput(self.output_weight(), self.output_bias(), self.output_ids)

    def step_logits(self, x: Tensor, out: StepOutput, *, kept_only: bool = False) -> Tensor:
        """:meth:`logits` of x (R, D) with the matrix of :meth:`step_output`: (R, V), or (R, K) over ``out.ids`` only
        with ``kept_only`` (the -inf of the V - K other ids left out; the caller maps columns back to ids)."""
        if self.output_ids is None and not self.fix_norm:
            return self.output_proj(x)  # the module call, as in logits(): forward hooks see the output layer
        logits = self.ops.output_linear(x, out.weight, out.bias)  # (R, K)
        if self.output_ids is None or kept_only:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.tgt_vocab_size), float("-inf"))  # (R, V)
        return full.index_copy_(-1, self.output_ids, logits)

    def logits(self, x: Tensor) -> Tensor:
        """Top decoder states (..., D) -> logits over the full target vocabulary (..., V); with ``restrict_output``
        the pieces not kept get -inf (the matmul runs over the K kept rows, then one scatter)."""
        if self.output_ids is None and not self.fix_norm:
            return self.output_proj(x)  # the module call: forward hooks (tmt inspect) see the output layer
        logits = self.ops.output_linear(x, self.output_weight(), self.output_bias())  # (..., K)
        if self.output_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.tgt_vocab_size), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.output_ids, logits)
