"""Parallel corpora: reading, the encoded cache, token-budget batches and a run's data preparation."""

from transformer_mt.data.corpus import Batch, DataError, ParallelData, SampledSegmentation, collate, load_parallel, make_batches, shard, source_tensor
from transformer_mt.data.prepare import load_corpora, prepare_tokenizers, preprocess

__all__ = ["Batch", "DataError", "ParallelData", "SampledSegmentation", "collate", "load_corpora", "load_parallel", "make_batches", "prepare_tokenizers", "preprocess", "shard", "source_tensor"]
