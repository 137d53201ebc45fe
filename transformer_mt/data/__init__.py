"""Parallel corpora: reading and filtering, the encoded on-disk cache, token-budget batches, subword sampling,
several corpora mixed by weight, and a run's data preparation."""

from transformer_mt.data.batching import Batch, collate, make_batches, shard, source_tensor
from transformer_mt.data.corpus import DataError, PairFilter, ParallelData, load_parallel
from transformer_mt.data.datasets import Datasets, TrainingSet, ValidationSet, load_datasets
from transformer_mt.data.mixing import MixedCorpus, epoch_pairs, epoch_sample
from transformer_mt.data.packing import PackedBatch, pack
from transformer_mt.data.prepare import load_corpora, prepare_tokenizers, preprocess
from transformer_mt.data.sampling import SampledSegmentation
from transformer_mt.data.summary import CorpusSummary

__all__ = [
    "Batch",
    "CorpusSummary",
    "DataError",
    "Datasets",
    "MixedCorpus",
    "PackedBatch",
    "PairFilter",
    "ParallelData",
    "SampledSegmentation",
    "TrainingSet",
    "ValidationSet",
    "collate",
    "epoch_pairs",
    "epoch_sample",
    "load_corpora",
    "load_datasets",
    "load_parallel",
    "make_batches",
    "pack",
    "prepare_tokenizers",
    "preprocess",
    "shard",
    "source_tensor",
]
