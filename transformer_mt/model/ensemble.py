"""Several models decoding as one: the search sees the model interface (``search.SearchModel``), and
each step scores tokens by the mean of the members' probabilities.

log p(y) = log((1/N) * sum_i p_i(y)) = logsumexp_i(log p_i(y)) - log N, fairseq's ``EnsembleModel``
rule (averaging probabilities, not logits or log-probs). Every member keeps its own encoder output
and decoder cache; ``reorder`` follows the beams in all of them. Members must share the target
vocabulary (the same sentencepiece model), which the caller checks with the tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.layers import TypedModuleList
from transformer_mt.model.static_cache import StaticDecoderCache
from transformer_mt.model.transformer import EncoderOut, Transformer


class EnsembleCache:
    """One decoder cache per member, reordered together: all growing (``DecoderCache``) or all static
    (``StaticDecoderCache``)."""

    def __init__(self, caches: Sequence[DecoderCache | StaticDecoderCache]):
        self.caches = list(caches)

    def reorder(self, indices: Tensor, *, group: int | None = None, kept: Tensor | None = None) -> None:
        """Row i becomes old row ``indices[i]`` in every member's cache (see DecoderCache.reorder, also for
        ``group`` and ``kept``, the layout a search states so that no cache reads the indices back)."""
        for cache in self.caches:
            cache.reorder(indices, group=group, kept=kept)

    @property
    def position(self) -> int | Tensor:
        """The position the next step decodes: the members step together, so the first one's."""
        return self.caches[0].position

    def joined(self, other: EnsembleCache) -> EnsembleCache:
        """This batch's rows, then ``other``'s, in every member's cache (see DecoderCache.joined; growing caches
        only)."""
        joined = []
        for mine, theirs in zip(self.caches, other.caches):
            if not isinstance(mine, DecoderCache) or not isinstance(theirs, DecoderCache):
                raise ValueError("only growing caches join (a static cache's buffers are sized for one batch)")
            joined.append(mine.joined(theirs))
        return EnsembleCache(joined)


class Ensemble(nn.Module):
    """``encode`` / ``init_cache`` / ``decode_step`` over N Transformers with one target vocabulary."""

    def __init__(self, models: list[Transformer]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        sizes = {m.output_proj.weight.size(0) for m in models}
        if len(sizes) != 1:
            raise ValueError(
                f"ensemble members have different target vocabularies ({sorted(sizes)} ids); "
                "ensemble only models trained with the same tokenizer"
            )
        specials = {m.specials for m in models}
        if len(specials) != 1:
            raise ValueError(
                f"ensemble members have different special ids ({sorted(map(str, specials))}); "
                "ensemble only models trained with the same tokenizer"
            )
        self.specials = models[0].specials
        self.members = TypedModuleList(models)

    def max_output_length(self) -> int | None:
        """The shortest of the members' limits (None when no member has one)."""
        limits = [limit for limit in (m.max_output_length() for m in self.members) if limit is not None]
        return min(limits, default=None)

    def reserve_positions(self, n: int) -> None:
        """Every member's :meth:`Transformer.reserve_positions`: positions [0, n) ready before decoding."""
        for m in self.members:
            m.reserve_positions(n)

    def encode(self, src: Tensor) -> list[EncoderOut]:
        """src (B, S) -> one EncoderOut per member."""
        return [m.encode(src) for m in self.members]

    def init_cache(self, encs: list[EncoderOut]) -> EnsembleCache:
        return EnsembleCache([m.init_cache(enc) for m, enc in zip(self.members, encs)])

    def init_static_cache(self, encs: list[EncoderOut], *, max_len: int) -> EnsembleCache:
        """Every member's :meth:`Transformer.init_static_cache`: K/V preallocated to ``max_len`` positions."""
        return EnsembleCache([m.init_static_cache(enc, max_len=max_len) for m, enc in zip(self.members, encs)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        """tokens (B,) -> (B, V) float32 log of the members' mean next-token probabilities (normalised
        log-probs are valid logits: the search's log-softmax leaves them unchanged)."""
        lprobs = [
            torch.log_softmax(m.decode_step(tokens, c).float(), dim=-1) for m, c in zip(self.members, cache.caches)
        ]
        return torch.logsumexp(torch.stack(lprobs), dim=0) - math.log(len(lprobs))  # (N, B, V) -> (B, V)
