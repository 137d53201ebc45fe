"""Search over a model and the Translator that turns text into translations."""

from transformer_mt.decoding.mbr import Candidate, MbrError, mbr_choose, mbr_files, pool_weights, read_candidates
from transformer_mt.decoding.search import SearchCache, SearchError, SearchModel, beam_search, greedy_search, length_penalty, max_beam, search
from transformer_mt.decoding.translator import TranslateError, TranslateStats, Translator, positions_needed, translate_ids, translate_stream

__all__ = [
    "Candidate",
    "MbrError",
    "SearchCache",
    "SearchError",
    "SearchModel",
    "TranslateError",
    "TranslateStats",
    "Translator",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "max_beam",
    "mbr_choose",
    "mbr_files",
    "pool_weights",
    "positions_needed",
    "read_candidates",
    "search",
    "translate_ids",
    "translate_stream",
]
