"""Search over a model and the Translator that turns text into translations.

- ``search``: ``search`` and beam search over the ``SearchModel`` protocol, and the conventions both searches keep;
  ``greedy``: greedy search over one batch or several; ``steps``: what the two share at a step;
- ``protocol``: the model's and the cache's protocols, the hypotheses and steps the searches give back, and
  ``TextTranslator``, what evaluation and serving call;
- ``lengths``: the length penalty, the longest output and the positions a batch needs;
- ``translator``: ``load``, ``Translator`` (text in, translations out), ``translate_ids`` and streams;
- ``mbr``: minimum Bayes risk choice among pooled candidate files.
"""

from transformer_mt.config import (
    max_beam,
)  # the rule lives with the config; kept importable beside the search it bounds
from transformer_mt.decoding.greedy import greedy_search, greedy_search_batches
from transformer_mt.decoding.lengths import length_penalty, max_output_length, positions_needed
from transformer_mt.decoding.mbr import Candidate, MbrError, mbr_choose, mbr_files, pool_weights, read_candidates
from transformer_mt.decoding.protocol import BeamStep, Hypothesis, SearchCache, SearchError, SearchModel, TextTranslator
from transformer_mt.decoding.search import beam_search, search
from transformer_mt.decoding.translator import (
    CheckpointModel,
    TranslateError,
    TranslateStats,
    Translation,
    TranslationResult,
    Translator,
    checked_request,
    load,
    model_from_checkpoint,
    translate_ids,
    translate_stream,
)

__all__ = [
    "BeamStep",
    "Candidate",
    "CheckpointModel",
    "Hypothesis",
    "MbrError",
    "SearchCache",
    "SearchError",
    "SearchModel",
    "TextTranslator",
    "TranslateError",
    "TranslateStats",
    "Translation",
    "TranslationResult",
    "Translator",
    "beam_search",
    "checked_request",
    "greedy_search",
    "greedy_search_batches",
    "length_penalty",
    "load",
    "max_beam",
    "max_output_length",
    "mbr_choose",
    "model_from_checkpoint",
    "mbr_files",
    "pool_weights",
    "positions_needed",
    "read_candidates",
    "search",
    "translate_ids",
    "translate_stream",
]
