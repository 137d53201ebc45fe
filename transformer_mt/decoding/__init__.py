"""Search over a model and the Translator that turns text into translations."""

from transformer_mt.config import max_beam  # the rule lives with the config; kept importable beside the search it bounds
from transformer_mt.decoding.mbr import Candidate, MbrError, mbr_choose, mbr_files, pool_weights, read_candidates
from transformer_mt.decoding.search import (
    Hypothesis,
    SearchCache,
    SearchError,
    SearchModel,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_length,
    search,
)
from transformer_mt.decoding.translator import (
    CheckpointModel,
    TranslateError,
    TranslateStats,
    Translation,
    TranslationResult,
    Translator,
    load,
    model_from_checkpoint,
    positions_needed,
    translate_ids,
    translate_stream,
)

__all__ = [
    "Candidate",
    "CheckpointModel",
    "Hypothesis",
    "MbrError",
    "SearchCache",
    "SearchError",
    "SearchModel",
    "TranslateError",
    "TranslateStats",
    "Translation",
    "TranslationResult",
    "Translator",
    "beam_search",
    "greedy_search",
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
