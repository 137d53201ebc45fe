"""Search over a model and the Translator that turns text into translations.

The modules, bottom to top (each imports only those below it; an import-linter contract holds the order):

- ``protocol``: what the searches need from a model and its cache, and the hypotheses and steps they give back;
  ``lengths``: the length penalty, the longest output and the positions a batch needs;
- ``steps``: what greedy and beam search share at a step, and ``check_settings``, the search rules' one check;
- ``graphs``: how a search runs its steps: the growing cache, a static one, or ``GraphedStep`` (static buffers shared by
  every batch, a CUDA graph per batch bucket);
- ``greedy``: greedy search over one batch or several; ``beam``: beam search over one batch; ``sampling``: sampled
  outputs (temperature, top-k, top-p, epsilon), seeded per line;
- ``search``: ``search`` and ``search_batches``, the one place that picks greedy or beam search, or sampling;
- ``results``: what a translator of text offers (``TextTranslator``) and returns, and the checks of a request;
  ``rebuild``: a checkpoint's weights checked and rebuilt into a model;
- ``loading``: a checkpoint's model, config and tokenizers; ``batching``: ``translate_ids`` and the text rules'
  encoding; ``streams``: ``translate_stream``, chunks of lines translated and written in order;
- ``translator``: ``Translator``, ``LanguageTranslator`` (any translator asked for one target language) and ``load``;
  ``mbr``: minimum Bayes risk choice among pooled candidate files.
"""

from transformer_mt.decoding.batching import translate_ids
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.graphs import GraphedStep, GraphStats, static_decoding_by_default
from transformer_mt.decoding.greedy import greedy_search, greedy_search_batches
from transformer_mt.decoding.lengths import length_penalty, max_output_length, positions_needed
from transformer_mt.decoding.loading import CheckpointModel, model_from_checkpoint
from transformer_mt.decoding.mbr import Candidate, MbrError, mbr_choose, mbr_files, pool_weights, read_candidates
from transformer_mt.decoding.prefix import ForcedPrefix, decoder_language_ids
from transformer_mt.decoding.protocol import BeamStep, Hypothesis, SearchCache, SearchError, SearchModel
from transformer_mt.decoding.results import (
    TextTranslator,
    TranslateError,
    TranslateStats,
    Translation,
    TranslationResult,
    checked_request,
)
from transformer_mt.decoding.sampling import Sampling, draw, mixed_seed, sample_batches, sampling_request
from transformer_mt.decoding.search import search, search_batches
from transformer_mt.decoding.streams import translate_stream
from transformer_mt.decoding.translator import LanguageTranslator, Translator, load

__all__ = [
    "ForcedPrefix",
    "BeamStep",
    "Candidate",
    "CheckpointModel",
    "GraphStats",
    "GraphedStep",
    "Hypothesis",
    "LanguageTranslator",
    "MbrError",
    "Sampling",
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
    "decoder_language_ids",
    "draw",
    "greedy_search",
    "greedy_search_batches",
    "length_penalty",
    "load",
    "max_output_length",
    "mbr_choose",
    "mbr_files",
    "mixed_seed",
    "model_from_checkpoint",
    "pool_weights",
    "positions_needed",
    "read_candidates",
    "sample_batches",
    "sampling_request",
    "search",
    "search_batches",
    "static_decoding_by_default",
    "translate_ids",
    "translate_stream",
]
