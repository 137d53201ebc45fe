"""Scoring a model: validation loss and BLEU during `tmt train`, and `tmt evaluate` on a test set.

Both score with sacreBLEU through metrics.score (default 13a tokenization, signatures).

Validation runs on the model in memory: `validation_loss`, the label-smoothed loss, the plain NLL and
the perplexity over the whole validation set, teacher-forced, and `validation_bleu`, BLEU of greedy (or
beam) translations of its first sentences against their raw references. Both are sums over target
tokens (pieces + EOS, padding excluded) divided once by their count, so the result does not
depend on how the set is batched.

`evaluate_file` is `tmt evaluate`: a translator (a Translator of one checkpoint or an ensemble, or the CTranslate2
engine) translates a source file into a hypotheses file, written safely (never over an input), then BLEU and chrF
of that file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt import runtime
from transformer_mt.config import DecodeConfig
from transformer_mt.data import ParallelData
from transformer_mt.decoding import TextTranslator, TranslateStats, translate_ids, translate_stream
from transformer_mt.errors import TmtError
from transformer_mt.evaluation.metrics import read_lines, score
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.text import Tokenizer, file_chunks, safe_output


@dataclass
class BleuSet:
    """The validation pairs BLEU is computed on: encoded sources and raw references."""

    src_ids: list[list[int]]  # source pieces, without EOS
    refs: list[str]  # reference lines as written (sacreBLEU tokenizes them)
    truncated: int = 0  # sources cut to the model's length
    tgt_prefix: Sequence[int] = ()  # an NLLB model's forced decoder start after its start id: the target's code


class ValidationError(TmtError, ValueError):
    """A validation set the model cannot be validated on, worded for the user."""


def bleu_set(
    src_path: str,
    tgt_path: str,
    src_tok: Tokenizer,
    *,
    limit: int,
    max_src_tokens: int | None = None,
    src_prefix: Sequence[int] = (),
    tgt_prefix: Sequence[int] = (),
) -> BleuSet:
    """The first `limit` (0 = all) validation pairs with text on both sides, each source starting with the tag ids
    `src_prefix` (a multilingual model's target language, as the translator asks for it); sources longer than
    `max_src_tokens` are truncated, as `tmt translate` does (`truncated` counts them). `tgt_prefix`: an NLLB
    model's target language code, which the searches put after the decoder's start (not scored, not in the output)."""
    pairs = [(s, r) for s, r in zip(read_lines(src_path), read_lines(tgt_path)) if s.strip() and r.strip()]
    if limit > 0:
        pairs = pairs[:limit]
    src_ids = [list(src_prefix) + ids for ids in src_tok.encode([s for s, _ in pairs])]
    long = [] if max_src_tokens is None else [i for i, ids in enumerate(src_ids) if len(ids) > max_src_tokens]
    for i in long:
        src_ids[i] = src_ids[i][:max_src_tokens]
    return BleuSet(src_ids, [r for _, r in pairs], truncated=len(long), tgt_prefix=tuple(tgt_prefix))


def checked_validation_set(
    data: ParallelData,
    *,
    max_positions: int,
    name: str,
    drop_hint: str = "leave data.valid_src and data.valid_tgt empty",
) -> tuple[ParallelData, str | None]:
    """The validation set as a model with `max_positions` can take it, checked when loaded rather than at the
    first validation: refused when empty (ValidationError naming `name`; `drop_hint` says how to train without it);
    pairs longer than the positions allow are left out of the loss (training drops them by data.max_len; one
    giant line would exhaust memory). Returns the pairs kept and the line for the log (None when all are kept)."""
    limit = max_positions - 1  # + EOS on the source, + BOS on the decoder input
    if data.num_pairs == 0:
        raise ValidationError(
            f"{name}: the validation set holds no pairs (empty files, or empty lines only); "
            f"give a validation set, or {drop_hint} to train without one"
        )
    keep = (data.src_lengths <= limit) & (data.tgt_lengths <= limit)
    kept = int(keep.sum())
    if kept == data.num_pairs:
        return data, None
    if kept == 0:
        raise ValidationError(
            f"{name}: every validation pair is longer than {limit} pieces (model.max_positions={max_positions}); "
            "check the validation files"
        )
    return data.subset(keep), (
        f"validation{' ' + data.summary.name if data.summary.name else ''}: {data.num_pairs - kept} of "
        f"{data.num_pairs} pairs longer than {limit} pieces "
        f"(model.max_positions={max_positions}) left out of the validation loss"
    )


def validation_loss(
    model: Transformer,
    data: ParallelData,
    *,
    max_tokens: int,
    seed: int,
    label_smoothing: float,
    device: torch.device,
    dtype: str = "float32",
) -> dict[str, float]:
    """val_loss (label-smoothed), val_nll and val_ppl per target token over all of `data`, teacher-forced."""
    model.eval()
    # validation lines are not length-filtered: sinusoids extend past the training lengths (section 3.5)
    if data.num_pairs:
        model.reserve_positions(int(max(data.src_lengths.max(), data.tgt_lengths.max())) + 1)  # + EOS / BOS
    loss_sum = nll_sum = 0.0
    ntokens = 0
    with torch.inference_mode(), runtime.autocast(device, dtype):
        for idx in data.batches(0, max_tokens=max_tokens, seed=seed):
            batch = data.get_batch(idx).to(device)
            # the training objective's module: with model.restrict_output, the K kept pieces (model.output_targets)
            loss, nll, n = TeacherForcedLoss(model, label_smoothing=label_smoothing)(
                batch.src, batch.tgt_in, batch.tgt_out
            )
            loss_sum, nll_sum, ntokens = loss_sum + loss.item(), nll_sum + nll.item(), ntokens + int(n)
    return {
        "val_loss": loss_sum / ntokens,
        "val_nll": nll_sum / ntokens,
        "val_ppl": math.exp(min(nll_sum / ntokens, 100.0)),
    }


def validation_bleu(
    model: Transformer,
    pairs: BleuSet,
    tgt_tok: Tokenizer,
    *,
    beam: int,
    decode: DecodeConfig,
    device: torch.device,
    dtype: str = "float32",
) -> float:
    """sacreBLEU (default 13a tokenization) of `pairs` translated with `beam` and decode's lenpen and length limits."""
    hyps = translate_ids(
        model,
        pairs.src_ids,
        beam=beam,
        lenpen=decode.lenpen,
        max_len_a=decode.max_len_a,
        max_len_b=decode.max_len_b,
        batch_tokens=decode.batch_tokens,
        device=device,
        dtype=dtype,
        prefix=pairs.tgt_prefix,
    )
    text = tgt_tok.decode([h[0].tokens for h in hyps])
    return score(text, [pairs.refs], metrics=("bleu",))["bleu"]["score"]


# ---------------------------------------------------------------- tmt evaluate
@dataclass
class Evaluation:
    """What `tmt evaluate` reports: the scores of the written hypotheses and the translation speed."""

    scores: dict[str, dict[str, Any]]  # metrics.score's result for "bleu" and "chrf" (score, signature, text)
    stats: TranslateStats  # lines, target tokens, seconds, truncated inputs
    beam: int
    lenpen: float
    hypotheses: Path  # the file the scores are of

    def report(self) -> dict[str, Any]:
        """The --json object."""
        st, bleu, chrf = self.stats, self.scores["bleu"], self.scores["chrf"]
        return {
            "bleu": round(bleu["score"], 2),
            "chrf": round(chrf["score"], 2),
            "sentences_per_s": round(st.lines / st.seconds, 2),
            "tgt_tokens_per_s": round(st.tgt_tokens / st.seconds, 1),
            "seconds": round(st.seconds, 2),
            "beam": self.beam,
            "lenpen": self.lenpen,
            "hypotheses": str(self.hypotheses),
            "bleu_signature": bleu["signature"],
            "chrf_signature": chrf["signature"],
        }

    def text(self) -> list[str]:
        """The lines printed without --json: sacreBLEU's BLEU and chrF lines, then the speed."""
        st, rep = self.stats, self.report()
        return [
            self.scores["bleu"]["text"],
            self.scores["chrf"]["text"],
            f"{st.lines} sentences in {st.seconds:.1f} s: {rep['sentences_per_s']} sentences/s, "
            f"{rep['tgt_tokens_per_s']} target tokens/s (beam {self.beam}, lenpen {self.lenpen}); "
            f"hypotheses in {self.hypotheses}",
        ]


def evaluate_file(
    translator: TextTranslator,
    src: str | os.PathLike,
    refs: Sequence[str | os.PathLike],
    *,
    output: str | os.PathLike,
    beam: int,
    lenpen: float,
    batch_tokens: int | None = None,
    lowercase: bool = False,
    keep_intact: Sequence[str | os.PathLike] = (),
) -> Evaluation:
    """Translate `src` into `output` and score it against `refs` (one file per reference stream).

    The references are read first, so a bad one fails before the translation. `output` is written
    through a temporary file renamed into place, and may not be `src`, a reference or one of
    `keep_intact` (e.g. the checkpoints)."""
    ref_lines = [read_lines(r) for r in refs]
    with safe_output(output, inputs=[src, *refs, *keep_intact]) as out:
        stats = translate_stream(translator, file_chunks(src), out, beam=beam, lenpen=lenpen, batch_tokens=batch_tokens)
    scores = score(
        read_lines(output),
        ref_lines,
        metrics=("bleu", "chrf"),
        lowercase=lowercase,
        hyp_name=str(output),
        ref_names=[str(r) for r in refs],
    )
    return Evaluation(scores, stats, beam, lenpen, Path(output))
