"""Validation inside the training loop: the loss over the whole validation set and BLEU on its first sentences
(evaluation/), of the EMA weights when train.ema_decay > 0, so that checkpoint_best.pt is chosen on the
weights decoding uses. A stop asked for meanwhile cuts it short at the next batch (stopping.py). The validation
beam is checked against the vocabulary when the run starts (`check_valid_beam`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

from transformer_mt.config import Config, ConfigError, TrainConfig, beam_problem, max_beam
from transformer_mt.data import ParallelData
from transformer_mt.evaluation import BleuSet, bleu_set, validation_bleu, validation_loss
from transformer_mt.model import Transformer
from transformer_mt.text import Tokenizer
from transformer_mt.training.ema import EMA
from transformer_mt.training.stopping import Stopping


class Validator:
    """Validates one run's model on its validation set."""

    def __init__(
        self,
        cfg: Config,
        data: ParallelData,
        tokenizers: tuple[Tokenizer, Tokenizer],
        *,
        device: torch.device,
        log: Callable[[str], None],
    ):
        self.cfg, self.t, self.data, self.device, self.log = cfg, cfg.train, data, device, log
        self.src_tok, self.tgt_tok = tokenizers

    def __call__(self, model: Transformer, *, ema: EMA | None, stopping: Stopping, dtype: str) -> dict[str, float]:
        """val_loss, val_nll, val_ppl, and val_bleu unless train.valid_bleu_sentences < 0. Raises
        stopping.ValidationCutShort when a stop is asked for before it ends; the raw weights are back either way."""
        t = self.t
        # a safe point before every batch's encoder pass: the loss batches and the BLEU search batches alike
        with ema.applied() if ema is not None else contextlib.nullcontext(), stopping.checked_before(model.encoder[0]):
            stopping.check()
            result = validation_loss(
                model,
                self.data,
                max_tokens=t.max_tokens,
                seed=t.seed,
                label_smoothing=t.label_smoothing,
                device=self.device,
                dtype=dtype,
            )
            if t.valid_bleu_sentences >= 0:
                result["val_bleu"] = validation_bleu(
                    model,
                    self.bleu_set,
                    self.tgt_tok,
                    beam=t.valid_beam,
                    decode=self.cfg.decode,
                    device=self.device,
                    dtype=dtype,
                )
        return result

    @functools.cached_property
    def bleu_set(self) -> BleuSet:
        """The validation pairs of BLEU, read and encoded once per run; sources longer than the model takes are
        truncated, as `tmt translate` does, and counted in the log."""
        limit = self.cfg.model.max_positions - 1  # + EOS
        pairs = bleu_set(
            self.cfg.data.valid_src,
            self.cfg.data.valid_tgt,
            self.src_tok,
            limit=self.t.valid_bleu_sentences,
            max_src_tokens=limit,
        )
        if pairs.truncated:
            self.log(
                f"validation BLEU: {pairs.truncated} of {len(pairs.src_ids)} sources longer than {limit} pieces "
                "truncated"
            )
        return pairs


def check_valid_beam(t: TrainConfig, *, validates_bleu: bool, tgt_vocab_size: int) -> None:
    """The validation beam against the target vocabulary now, not at the first validation hours later (the
    config's own checks refused a beam below 1, so a problem here is the vocabulary's bound)."""
    if not validates_bleu or t.valid_bleu_sentences < 0:
        return
    if beam_problem(t.valid_beam, tgt_vocab_size=tgt_vocab_size) is not None:
        raise ConfigError(
            f"train.valid_beam={t.valid_beam}: the target vocabulary has {tgt_vocab_size} ids, enough for a beam "
            f"of at most {max_beam(tgt_vocab_size)}; lower train.valid_beam (1 = greedy)"
        )
