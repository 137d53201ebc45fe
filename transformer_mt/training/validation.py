"""Validation inside the training loop: the loss over the whole validation set and BLEU on its first sentences
(evaluation/), of the EMA weights when train.ema_decay > 0, so that checkpoint_best.pt is chosen on the
weights decoding uses. A stop asked for meanwhile cuts it short at the next batch (stopping.py). The validation
beam is checked against the vocabulary when the run starts (`check_valid_beam`).

Several sets (``data.valid``, e.g. one per direction of a multilingual model): each is validated as the one set of
the shorthand would be, its sources starting with its target language's tag, and the results are their per-set
values (``valid/<name>/loss``, ``valid/<name>/bleu``) and their unweighted means (``val_loss``, ``val_nll``,
``val_bleu``; ``val_ppl`` = exp of the mean ``val_nll``): every direction counts the same, whatever its size, and
``train.best_metric`` picks checkpoint_best.pt on the mean."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import torch

from transformer_mt.config import Config, ConfigError, TrainConfig, beam_problem, max_beam
from transformer_mt.data import ValidationSet
from transformer_mt.evaluation import BleuSet, bleu_set, validation_bleu, validation_loss
from transformer_mt.model import Transformer
from transformer_mt.text import Tokenizer
from transformer_mt.training.ema import EMA
from transformer_mt.training.stopping import Stopping


class Validator:
    """Validates one run's model on its validation sets."""

    def __init__(
        self,
        cfg: Config,
        sets: list[ValidationSet],
        tokenizers: tuple[Tokenizer, Tokenizer],
        *,
        device: torch.device,
        log: Callable[[str], None],
    ):
        self.cfg, self.t, self.sets, self.device, self.log = cfg, cfg.train, sets, device, log
        self.src_tok, self.tgt_tok = tokenizers
        self.per_set = bool(cfg.data.valid)  # data.valid: per-set values and their means; the shorthand: as always

    def __call__(self, model: Transformer, *, ema: EMA | None, stopping: Stopping, dtype: str) -> dict[str, float]:
        """val_loss, val_nll, val_ppl, and val_bleu unless train.valid_bleu_sentences < 0 (with data.valid: their
        means, and each set's loss and BLEU). Raises stopping.ValidationCutShort when a stop is asked for before it
        ends; the raw weights are back either way."""
        # a safe point before every batch's encoder pass: the loss batches and the BLEU search batches alike
        with ema.applied() if ema is not None else contextlib.nullcontext(), stopping.checked_before(model.encoder[0]):
            stopping.check()
            results = [self.validate_set(model, i, dtype=dtype) for i in range(len(self.sets))]
        return with_means(results, [s.name for s in self.sets]) if self.per_set else results[0]

    def validate_set(self, model: Transformer, i: int, *, dtype: str) -> dict[str, float]:
        """Set i's val_loss, val_nll, val_ppl and val_bleu (unless train.valid_bleu_sentences < 0)."""
        t = self.t
        result = validation_loss(
            model,
            self.sets[i].data,
            max_tokens=t.max_tokens,
            seed=t.seed,
            label_smoothing=t.label_smoothing,
            device=self.device,
            dtype=dtype,
        )
        if t.valid_bleu_sentences >= 0:
            result["val_bleu"] = validation_bleu(
                model,
                self.bleu_sets[i],
                self.tgt_tok,
                beam=t.valid_beam,
                decode=self.cfg.decode,
                device=self.device,
                dtype=dtype,
            )
        return result

    @functools.cached_property
    def bleu_sets(self) -> list[BleuSet]:
        """The validation pairs of BLEU, set by set, read and encoded once per run; sources longer than the model
        takes are truncated, as `tmt translate` does, and counted in the log."""
        limit = self.cfg.model.max_positions - 1  # + EOS
        out = []
        for vset in self.sets:
            pairs = bleu_set(
                vset.config.src,
                vset.config.tgt,
                self.src_tok,
                limit=self.t.valid_bleu_sentences,
                max_src_tokens=limit,
                src_prefix=vset.src_prefix,
                tgt_prefix=vset.tgt_prefix,
            )
            if pairs.truncated:
                self.log(
                    f"validation BLEU{' of ' + vset.name if self.per_set else ''}: {pairs.truncated} of "
                    f"{len(pairs.src_ids)} sources longer than {limit} pieces truncated"
                )
            out.append(pairs)
        return out


PER_SET = ("loss", "bleu")  # the values each set reports as valid/<name>/<value>


def with_means(results: list[dict[str, float]], names: list[str]) -> dict[str, float]:
    """The means over sets of val_loss, val_nll and val_bleu (val_ppl: exp of the mean val_nll), then each set's
    PER_SET values as valid/<name>/<value>."""
    out = {key: sum(r[key] for r in results) / len(results) for key in ("val_loss", "val_nll")}
    out["val_ppl"] = math.exp(min(out["val_nll"], 100.0))
    if all("val_bleu" in r for r in results):
        out["val_bleu"] = sum(r["val_bleu"] for r in results) / len(results)
    for name, result in zip(names, results):
        out.update({f"valid/{name}/{key}": result[f"val_{key}"] for key in PER_SET if f"val_{key}" in result})
    return out


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
