"""What the searches need from a model and what they give back: the :class:`SearchModel` and :class:`SearchCache`
protocols (``Transformer`` and ``Ensemble`` satisfy them; the search imports neither), a finished
:class:`Hypothesis`, the :class:`BeamStep` an observer of beam search sees, and :class:`SearchError`.

The bottom of the package: it imports no other module of ``decoding``. What a translator of text offers
(``TextTranslator``) is one level up, in :mod:`transformer_mt.decoding.results`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

from torch import Tensor

from transformer_mt.errors import TmtError
from transformer_mt.text import SpecialIds


@runtime_checkable
class SearchCache(Protocol):
    """The decoding state of one batch, made by ``SearchModel.init_cache`` and owned by the search."""

    def reorder(self, indices: Tensor, *, group: int | None = None, kept: Tensor | None = None) -> None:
        """Row i becomes old row ``indices[i]`` (LongTensor (R',), any R'): expand to beams, follow beam
        reshuffles, drop finished rows. The searches also state the new layout (a cache may use it instead
        of reading ``indices`` back): runs of ``group`` rows, one sentence each, run j translating the
        sentence of current run ``kept[j]`` (``kept`` None: the same sentences, in the same order)."""
        ...


@runtime_checkable
class RestrictableCache(SearchCache, Protocol):
    """A cache whose model can score only the ids its output layer keeps (``DecoderCache``); the searches ask it."""

    def restrict_logits(self) -> Tensor | None:
        """From now on ``decode_step`` returns logits (R, K) over K ids only, column j for id ``ids[j]``: returns
        ``ids`` (K,), ascending, every id the model can score (the others' logits are -inf); None, and nothing
        changes, when the model scores every id of the vocabulary."""
        ...


@runtime_checkable
class JoinableCache(SearchCache, Protocol):
    """A cache that joins another of the same model at the same step into one batch (``DecoderCache``): greedy search
    then carries a batch's last rows along with the next batch (``greedy_search_batches``)."""

    def joined(self, other: JoinableCache) -> JoinableCache:
        """This cache's rows, then ``other``'s, as one cache; both hold one row per sentence and have decoded the same
        number of positions."""
        ...


EncT = TypeVar("EncT")  # whatever encode returns and init_cache takes (EncoderOut; a list of them for an ensemble)
CacheT = TypeVar("CacheT", bound=SearchCache)


@runtime_checkable
class SearchModel(Protocol[EncT, CacheT]):
    """What greedy and beam search need from a model (``Transformer``, ``Ensemble``), nothing more."""

    training: bool  # searching refuses a model in training mode (dropout on)
    specials: SpecialIds  # the ids rows start from, end with and are padded with

    def encode(self, src: Tensor) -> EncT:
        """src (B, S) token ids, right-padded, each row ending in EOS -> the encoder's output for the batch."""
        ...

    def init_cache(self, enc: EncT) -> CacheT:
        """A fresh cache for the batch, one row per sentence, nothing decoded yet."""
        ...

    def decode_step(self, tokens: Tensor, cache: CacheT) -> Tensor:
        """tokens (R,): the newest token of each cache row (the start id first) -> (R, V) logits (or log-probs) of
        the next token; the cache advances by one position."""
        ...

    def max_output_length(self) -> int | None:
        """The longest output the model can produce (a learned position table's size), or None."""
        ...


@dataclass
class Hypothesis:
    """One finished translation of one source sentence."""

    tokens: list[int]  # generated ids, without the start id and EOS
    score: float  # logprob / length_penalty(length, alpha); length counts EOS when present
    logprob: float  # sum of token log-probs, EOS included when present


class SearchError(TmtError, ValueError):
    """A search request that cannot be honoured, worded for the user."""


class BeamStep(NamedTuple):
    """One settled step of :func:`beam_search`, for an observer; b active sentences, k beams. Rows of a step are
    numbered ``slot * k + beam`` over the active sentences of that step (slot: the position in ``sent``)."""

    step: int  # 0-based; the hypotheses extended here hold step + 1 tokens
    sent: Tensor  # (b,) the original sentence of each active sentence
    rows: Tensor  # (b, k) the row (of this step) each next open beam extends
    tokens: Tensor  # (b, k) the token each appends
    logprob: Tensor  # (b, k) their log-probs, best first
    # (b, k) each: score, log-prob, step, row, token (-1 after EOS), valid: the best k finished so far
    finished: tuple[Tensor, ...]
    limit: Tensor  # (b,) each sentence's longest output
    going_on: Tensor  # (b,) bool: the sentence is searched further
