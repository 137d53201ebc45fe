"""A run's data: the training corpora and the checked validation sets, read (and encoded the first time) by data/;
several corpora mixed into one by their weights (data.MixedCorpus); with model.restrict_output, the output pieces a
new model keeps; what a resume's batch position refers to; and how much of each corpus training has seen.

Data parallel (torchrun, WORLD_SIZE > 1): rank 0 encodes the corpus caches first, the others then read them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, ConfigError
from transformer_mt.data import (
    Datasets,
    MixedCorpus,
    ParallelData,
    SampledSegmentation,
    TrainingSet,
    ValidationSet,
    epoch_pairs,
    load_datasets,
)
from transformer_mt.evaluation import checked_validation_set
from transformer_mt.text import Tokenizer
from transformer_mt.training.run import TrainError
from transformer_mt.training.state import Batching, Progress, TrainState
from transformer_mt.training.step import Corpus

Log = Callable[[str], None]


def load_data(
    cfg: Config, state: TrainState, src_tok: Tokenizer, tgt_tok: Tokenizer, *, resumed: bool, quiet: bool, log: Log
) -> tuple[Corpus, list[ValidationSet] | None]:
    """The training data (one corpus, or several mixed by weight; re-segmented every epoch with data.subword_alpha)
    and the checked validation sets (None without any); with model.restrict_output, a new model's kept output
    pieces (a resumed one keeps its checkpoint's)."""
    sets: Datasets = runtime.main_first(functools.partial(load_datasets, cfg, src_tok, tgt_tok, quiet=quiet))
    for one in sets.train:  # before the summary, so the line that says what is wrong stands alone
        _check_not_empty(one, shorthand=sets.shorthand)
    valid, notes = _checked_valid_sets(cfg, sets)
    if sets.shorthand:
        log(f"training data: {sets.train[0].data.summary.format()}")
    else:
        for line in mix_summary(cfg, sets.train):
            log(line)
    parts: list[ParallelData] | list[SampledSegmentation] = [one.data for one in sets.train]
    if cfg.model.restrict_output:
        if cfg.data.subword_alpha > 0:  # sampled segmentations use pieces the best one never does (scored as UNK)
            raise ConfigError(
                f"model.restrict_output keeps the pieces of the best segmentation of the training targets, but "
                f"data.subword_alpha={cfg.data.subword_alpha:g} samples others; set one of them off"
            )
        if not resumed:
            state.model.restrict_output_to(torch.cat([_target_pieces(one.data) for one in sets.train]))
        log(
            f"output layer: {state.model.output_size:,} of {tgt_tok.vocab_size:,} target pieces (model.restrict_output)"
        )
    if cfg.data.subword_alpha > 0:
        d = cfg.data
        parts = [
            SampledSegmentation(
                one.data,
                src_tok,
                tgt_tok,
                alpha=d.subword_alpha,
                nbest=d.subword_nbest,
                seed=cfg.train.seed,
                max_len=d.max_len,
            )
            for one in sets.train
        ]
        log(
            f"subword regularisation: training pairs re-segmented every epoch (alpha {d.subword_alpha:g}, nbest "
            f"{d.subword_nbest})"
        )
    train_data: Corpus = parts[0]
    if not sets.shorthand:
        train_data = MixedCorpus(
            parts,
            names=[one.name for one in sets.train],
            weights=[one.config.weight for one in sets.train],
            temperature=cfg.data.sampling_temperature,
        )
    for vset, note in zip(valid or [], notes):
        log(f"validation data: {vset.data.summary.format()}")
        if note:
            log(note)
    return train_data, valid


def _check_not_empty(one: TrainingSet, *, shorthand: bool) -> None:
    if one.data.num_pairs:
        return
    s = one.data.summary
    where = one.config.src if shorthand else f"{one.key} ({one.name})"
    raise TrainError(
        f"{where}: no training pairs left after filtering ({s.pairs_read:,} read: "
        f"{s.dropped_empty:,} empty, {s.dropped_too_long:,} over data.max_len={s.max_len} pieces, "
        f"{s.dropped_ratio:,} over data.max_len_ratio={s.max_len_ratio:g}"
        + (f", {s.dropped_filtered:,} by data.filters" if s.cleaned else "")
        + "); check the files, data.max_len and data.max_len_ratio"
        + ("" if shorthand else ", or remove the corpus")
    )


def _checked_valid_sets(cfg: Config, sets: Datasets) -> tuple[list[ValidationSet] | None, list[str | None]]:
    """The validation sets as the model can take them (evaluation.checked_validation_set), and the log's note of
    each; None without any."""
    if not sets.valid:
        return None, []
    out, notes = [], []
    for one in sets.valid:
        shorthand = not cfg.data.valid
        data, note = checked_validation_set(
            one.data,
            max_positions=cfg.model.max_positions,
            name=cfg.data.valid_src if shorthand else f"{one.key} ({one.name})",
            drop_hint="leave data.valid_src and data.valid_tgt empty" if shorthand else f"remove {one.key}",
        )
        out.append(dataclasses.replace(one, data=data))
        notes.append(note)
    return out, notes


def mix_summary(cfg: Config, train: Sequence[TrainingSet]) -> list[str]:
    """The log's lines of several corpora: the sampling rule, one line per corpus (pairs, target tokens, weight,
    pairs per epoch and the share of an epoch's target tokens expected from it), then each corpus's summary."""
    temperature = cfg.data.sampling_temperature
    per_epoch = epoch_pairs([one.data.num_pairs for one in train], [one.config.weight for one in train], temperature)
    shares = expected_shares(train, per_epoch.tolist())
    rule = "each corpus taken weight times" if temperature == 0 else f"shares ~ (weight x pairs)^(1/{temperature:g})"
    lines = [f"training data: {len(train)} corpora, data.sampling_temperature {temperature:g} ({rule})"]
    for one, k, share in zip(train, per_epoch.tolist(), shares):
        s = one.data.summary
        lines.append(
            f"  {one.name}: {s.kept:,} pairs, {s.tgt_tokens:,} target tokens, weight {one.config.weight:g}, "
            f"{k:,} pairs per epoch, expected share {100 * share:.1f}% of the target tokens"
        )
    return lines + [f"training data: {one.data.summary.format()}" for one in train]


def expected_shares(train: Sequence[TrainingSet], per_epoch: Sequence[int]) -> list[float]:
    """Each corpus's expected share of an epoch's target tokens (pieces + EOS): its k_i pairs times its mean target
    length, over the sum of these."""
    tokens = [
        k * (one.data.summary.tgt_tokens + one.data.num_pairs) / max(one.data.num_pairs, 1)
        for one, k in zip(train, per_epoch)
    ]
    total = sum(tokens)
    return [t / total if total else 0.0 for t in tokens]


def _target_pieces(data: ParallelData) -> torch.Tensor:
    """Every target id of the training pairs (repeats kept): the pieces model.restrict_output keeps
    (model.restrict_output_to)."""
    return torch.cat(
        [torch.from_numpy(data.pair(i)[1].astype("int64")) for i in range(data.num_pairs)]
        or [torch.zeros(0, dtype=torch.int64)]
    )


def corpus_tokens(data: Corpus, batches: list) -> dict[str, int]:
    """The target tokens (pieces + EOS) of ``batches`` by corpus name, with several corpora ({} with one): what
    Progress.count_update adds up for the log's shares."""
    if not isinstance(data, MixedCorpus):
        return {}
    return dict(zip(data.names, data.target_tokens(batches).tolist()))


def check_batching(progress: Progress, now: Batching, *, log: Log) -> None:
    """A resume continues at batch `batch_in_epoch` of its epoch's list; when the list itself changed (another
    corpus, weight, max_tokens or seed) that position means other batches, so the epoch starts again, and the log
    says so."""
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
    if isinstance(train_data, MixedCorpus):
        data = "+".join(Path(part.summary.cache).name for part in train_data.parts)
        corpora = ",".join(f"{name}*{weight!r}" for name, weight in zip(train_data.names, train_data.weights))
    else:
        data, corpora = Path(train_data.summary.cache).name, ""
    return Batching.of(
        data=data,
        max_tokens=t.max_tokens,
        seed=t.seed,
        subword_alpha=d.subword_alpha,
        subword_nbest=d.subword_nbest,
        corpora=corpora,
        temperature=d.sampling_temperature if corpora else 0.0,
    )
