"""Parallel corpora: reading and filtering, the encoded on-disk cache, token-budget batches, subword sampling
and a run's data preparation."""

from transformer_mt.data.batching import Batch, collate, make_batches, shard, source_tensor
from transformer_mt.data.corpus import CorpusSummary, DataError, ParallelData, load_parallel
from transformer_mt.data.packing import PackedBatch, pack
from transformer_mt.data.prepare import load_corpora, prepare_tokenizers, preprocess
from transformer_mt.data.sampling import SampledSegmentation

__all__ = [
    "Batch",
    "CorpusSummary",
    "DataError",
    "PackedBatch",
    "ParallelData",
    "SampledSegmentation",
    "collate",
    "load_corpora",
    "load_parallel",
    "make_batches",
    "pack",
    "prepare_tokenizers",
    "preprocess",
    "shard",
    "source_tensor",
]
