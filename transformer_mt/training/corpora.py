"""A run's data: the training corpus and the checked validation set, read (and encoded the first time) by data/;
with model.restrict_output, the output pieces a new model keeps; and what a resume's batch position refers to.

Data parallel (torchrun, WORLD_SIZE > 1): rank 0 encodes the corpus cache first, the others then read it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, ConfigError
from transformer_mt.data import ParallelData, SampledSegmentation, load_corpora
from transformer_mt.evaluation import checked_validation_set
from transformer_mt.text import Tokenizer
from transformer_mt.training.run import TrainError
from transformer_mt.training.state import Batching, Progress, TrainState
from transformer_mt.training.step import Corpus

Log = Callable[[str], None]


def load_data(
    cfg: Config, state: TrainState, src_tok: Tokenizer, tgt_tok: Tokenizer, *, resumed: bool, quiet: bool, log: Log
) -> tuple[Corpus, ParallelData | None]:
    """The training corpus (re-segmented every epoch with data.subword_alpha) and the checked validation set (None
    without one); with model.restrict_output, a new model's kept output pieces (a resumed one keeps its
    checkpoint's)."""
    train_data: Corpus
    train_data, valid_data = runtime.main_first(functools.partial(load_corpora, cfg, src_tok, tgt_tok, quiet=quiet))
    if train_data.num_pairs == 0:  # before the summary, so the line that says what is wrong stands alone
        s = train_data.summary
        raise TrainError(
            f"{cfg.data.train_src}: no training pairs left after filtering ({s.pairs_read:,} read: "
            f"{s.dropped_empty:,} empty, {s.dropped_too_long:,} over data.max_len={s.max_len} pieces, "
            f"{s.dropped_ratio:,} over data.max_len_ratio={s.max_len_ratio:g}); "
            "check the files, data.max_len and data.max_len_ratio"
        )
    valid_summary, dropped = None, None
    if valid_data is not None:
        valid_summary = valid_data.summary.format()
        valid_data, dropped = checked_validation_set(
            valid_data, max_positions=cfg.model.max_positions, name=cfg.data.valid_src
        )
    log(f"training data: {train_data.summary.format()}")
    if cfg.model.restrict_output:
        if cfg.data.subword_alpha > 0:  # sampled segmentations use pieces the best one never does (scored as UNK)
            raise ConfigError(
                f"model.restrict_output keeps the pieces of the best segmentation of the training targets, but "
                f"data.subword_alpha={cfg.data.subword_alpha:g} samples others; set one of them off"
            )
        if not resumed:
            state.model.restrict_output_to(_target_pieces(train_data))
        log(
            f"output layer: {state.model.output_size:,} of {tgt_tok.vocab_size:,} target pieces (model.restrict_output)"
        )
    if cfg.data.subword_alpha > 0:
        d = cfg.data
        train_data = SampledSegmentation(
            train_data,
            src_tok,
            tgt_tok,
            alpha=d.subword_alpha,
            nbest=d.subword_nbest,
            seed=cfg.train.seed,
            max_len=d.max_len,
        )
        log(
            f"subword regularisation: training pairs re-segmented every epoch (alpha {d.subword_alpha:g}, nbest "
            f"{d.subword_nbest})"
        )
    if valid_summary is not None:
        log(f"validation data: {valid_summary}")
        if dropped:
            log(dropped)
    return train_data, valid_data


def _target_pieces(data: ParallelData) -> torch.Tensor:
    """Every target id of the training pairs (repeats kept): the pieces model.restrict_output keeps
    (model.restrict_output_to)."""
    return torch.cat([torch.from_numpy(data.pair(i)[1].astype("int64")) for i in range(data.num_pairs)])


def check_batching(progress: Progress, now: Batching, *, log: Log) -> None:
    """A resume continues at batch `batch_in_epoch` of its epoch's list; when the list itself changed (another
    corpus, max_tokens or seed) that position means other batches, so the epoch starts again, and the log says so."""
    was = progress.batching
    if was is not None and was != now and progress.batch_in_epoch:
        log(
            f"resuming: the batching changed since the checkpoint ({', '.join(was.changes(now))}): "
            f"epoch {progress.epoch} starts again from its first batch "
            f"(batch {progress.batch_in_epoch} of the old list is another batch of the new one)"
        )
        progress.batch_in_epoch = 0
    progress.batching = now


def batching_of(cfg: Config, train_data: Corpus) -> Batching:
    """What this run's epoch batch lists depend on besides the epoch."""
    d, t = cfg.data, cfg.train
    return Batching.of(
        data=Path(train_data.summary.cache).name,
        max_tokens=t.max_tokens,
        seed=t.seed,
        subword_alpha=d.subword_alpha,
        subword_nbest=d.subword_nbest,
    )
