"""Sampling: every next token drawn from the model's distribution instead of searched for, over one batch or several,
one row per (sentence, sample), the rows leaving the batch as they end, as in greedy search (the conventions shared
with the searches are in :mod:`transformer_mt.decoding.search`).

Back-translation gains more from sampled outputs than from beam outputs (Edunov et al., 2018, "Understanding
Back-Translation at Scale"). A draw, in this order (:func:`draw`):

1. temperature: softmax(log-probs / ``temperature``) over the ids the model may generate (pad, the start id and BOS
   are never drawn);
2. the truncations, in this order, each measured on the distribution the one before left, renormalised (the order
   of Hugging Face's logits warpers and of CTranslate2), the tokens ranked most probable first (ties: the lower id
   first): ``top_k`` keeps the k most probable; ``top_p`` the nucleus, the fewest most probable tokens whose
   probability reaches p (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration"); ``epsilon`` the
   tokens of probability at least epsilon (Hewitt et al., 2022, "Truncation Sampling as Language Model
   Desmoothing"). The most probable token always stays;
3. renormalise over the tokens kept, and draw one by the inverse of their cumulative distribution.

Reproducible whatever the batches: the uniforms a sample uses come from its own ``torch.Generator`` (on the CPU, so
the same on every device and thread count), seeded from (``seed``, the input line's number, the sample's number).
A line's samples then depend on the seed, the line's number and the model alone: not on the batch size, the order
of the input, the other lines or the number of threads (up to the float rounding that a batch's padding brings to
the logits, as for greedy search). Sample j of a line is the same whatever ``nbest``.

A hypothesis reports the model's own log-probability of its tokens (temperature 1, no truncation), EOS included
when it has one, and its score the GNMT-normalised log-probability as a search's; a line's ``nbest`` samples are
listed best score first. Host syncs: one per step (the rows still running), and one per batch for the rows' limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.functional import pad

from transformer_mt.config import DecodeConfig, beam_problem, sampling_problem
from transformer_mt.decoding.lengths import length_penalty
from transformer_mt.decoding.protocol import Hypothesis, SearchError, SearchModel
from transformer_mt.decoding.steps import Columns, check_inputs, first_true, sentence_limits


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn (the ``decode`` keys of the same names) and where a call's lines are numbered from.
    Checked when made: a bad value raises :class:`SearchError` (``temperature=0 must be ...``)."""

    temperature: float = 1.0  # the log-probs are divided by it; 1 samples the model's own distribution
    top_k: int = 0  # only the k most probable tokens (0: no cut)
    top_p: float = 1.0  # only the nucleus: the fewest most probable tokens whose probability reaches top_p (1: no cut)
    epsilon: float = 0.0  # only the tokens of probability at least epsilon, the most probable always (0: no cut)
    seed: int = 0  # with a line's number and a sample's, seeds that sample's uniforms
    first_line: int = 0  # the number of a call's first line in the whole input (a stream's chunks number on)

    def __post_init__(self) -> None:
        problem = sampling_problem(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, epsilon=self.epsilon, seed=self.seed
        )
        if problem:
            raise SearchError(str(problem))
        if self.first_line < 0:
            raise SearchError(f"first_line={self.first_line} must be 0 or more (the number of a call's first line)")


def sampling_request(
    decode: DecodeConfig,
    *,
    sample: bool | None,
    beam: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    epsilon: float | None = None,
    seed: int | None = None,
    options: bool = False,
) -> Sampling | None:
    """The sampling a call asks for, or None to search: ``sample`` (None: ``decode.sample``) and each setting (None:
    ``decode``'s). Refused, as a SearchError worded ``temperature=0 must be ...`` (with ``options``, as the command
    line's ``--temperature 0 must be ...``): a bad value; a beam other than 1 given with sampling (it does not apply:
    ``nbest`` counts the samples); a sampling setting given without sampling, which would do nothing."""
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "epsilon": epsilon, "seed": seed}

    def refused(key: str, value: Any, reason: str) -> SearchError:
        return SearchError(f"--{key.replace('_', '-')} {value} {reason}" if options else f"{key}={value} {reason}")

    if not (decode.sample if sample is None else sample):
        stray = [key for key, value in given.items() if value is not None]
        if stray:
            name, switch = (f"--{stray[0].replace('_', '-')}", "--sample") if options else (stray[0], "sample=True")
            raise SearchError(f"{name} applies to sampling only; add {switch}, or leave it out")
        return None
    t, k, p, e = (
        decode.temperature if temperature is None else temperature,
        decode.top_k if top_k is None else top_k,
        decode.top_p if top_p is None else top_p,
        decode.epsilon if epsilon is None else epsilon,
    )
    chosen_seed = decode.seed if seed is None else seed
    problem = (None if beam is None else beam_problem(beam, sample=True)) or sampling_problem(
        temperature=t, top_k=k, top_p=p, epsilon=e, seed=chosen_seed
    )
    if problem:
        raise refused(problem.key, problem.value, problem.reason)
    return Sampling(temperature=t, top_k=k, top_p=p, epsilon=e, seed=chosen_seed)


def mixed_seed(seed: int, line: int, sample: int) -> int:
    """A 64-bit seed for sample ``sample`` of line ``line``: the three numbers mixed through numpy's ``SeedSequence``,
    so that nearby lines and seeds give unrelated streams (a sum such as seed + line would not)."""
    high, low = np.random.SeedSequence((seed, line, sample)).generate_state(2, np.uint32)  # two 32-bit words
    return int(high) << 32 | int(low)


def sample_generator(seed: int, line: int, sample: int) -> torch.Generator:
    """The CPU generator of sample ``sample`` of line ``line`` (:func:`mixed_seed`)."""
    return torch.Generator().manual_seed(mixed_seed(seed, line, sample))


def draw(lprobs: Tensor, uniforms: Tensor, sampling: Sampling) -> Tensor:
    """The columns drawn from ``lprobs`` (R, C) float32 log-probabilities (-inf: never drawn), one per row, each by
    its uniform of ``uniforms`` (R,) float32 in [0, 1): temperature, then top_k, top_p and epsilon, each measured on
    what the one before left, renormalised, then the draw (the module's docstring)."""
    scaled = lprobs if sampling.temperature == 1 else lprobs / sampling.temperature
    probs, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True, stable=True)  # (R, C) each
    cdf = probs.cumsum(dim=-1)  # (R, C)
    # Every truncation keeps a prefix of the ranked tokens, at least the first: `kept` (R,) is its length.
    kept = (probs > 0).sum(dim=-1)  # an impossible id (probability 0) is never drawn

    def mass() -> Tensor:  # (R, 1) the probability of the kept prefix, which renormalises it
        return cdf.gather(1, kept.unsqueeze(1) - 1)

    if sampling.top_k:
        kept = kept.clamp(max=sampling.top_k)
    if sampling.top_p < 1:
        before = pad(cdf[:, :-1], (1, 0))  # (R, C) the probability of the tokens ranked above each: 0 first
        kept = torch.minimum(kept, (before < sampling.top_p * mass()).sum(dim=-1))
    if sampling.epsilon > 0:
        kept = torch.minimum(kept, (probs >= sampling.epsilon * mass()).sum(dim=-1).clamp(min=1))
    # Inverse CDF over the kept prefix: the first rank whose cumulative probability passes u x (the kept mass),
    # so a kept token is drawn with its probability renormalised over the kept ones.
    last = kept.unsqueeze(1) - 1  # (R, 1)
    rank = torch.searchsorted(cdf, uniforms.unsqueeze(1) * mass(), right=True)  # (R, 1)
    return order.gather(1, torch.minimum(rank, last)).squeeze(1)  # (R,)


@torch.inference_mode()
def sample_batches(
    model: SearchModel[Any, Any],
    srcs: Sequence[Tensor],
    *,
    sampling: Sampling,
    nbest: int = 1,
    lines: Sequence[Sequence[int]] | None = None,
    lenpen: float = 0.0,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    max_output: int | None = None,
) -> list[list[list[Hypothesis]]]:
    """Per padded batch of ``srcs`` (B, S) and per sentence, ``nbest`` independent samples, best score first.

    ``lines``: per batch, each sentence's line number, which seeds its samples with ``sampling.seed``
    (None: the sentences numbered 0, 1, ... over all batches in order); ``sampling.first_line`` is added to it.
    """
    if nbest < 1:
        raise SearchError(f"nbest={nbest} is out of range; use 1 or more (the samples per sentence)")
    if lines is None:
        offsets = np.cumsum([0] + [src.size(0) for src in srcs]).tolist()
        lines = [range(a, b) for a, b in zip(offsets, offsets[1:])]
    elif [len(numbers) for numbers in lines] != [src.size(0) for src in srcs]:
        raise SearchError("lines must give one line number per sentence of each batch")
    return [
        _sample_batch(
            model,
            src,
            [sampling.first_line + n for n in numbers],
            sampling,
            nbest,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_output=max_output,
        )
        for src, numbers in zip(srcs, lines)
    ]


def _sample_batch(
    model: SearchModel[Any, Any],
    src: Tensor,
    lines: list[int],
    sampling: Sampling,
    nbest: int,
    *,
    lenpen: float,
    max_len_a: float,
    max_len_b: int,
    max_output: int | None,
) -> list[list[Hypothesis]]:
    """One batch: rows sentence-major (row ``i * nbest + j``: sample j of sentence i), decoded until each draws EOS or
    reaches its limit; a row that ends leaves the batch (``cache.reorder``), as in greedy search."""
    check_inputs(model, src)
    if src.size(0) == 0:
        return []
    sp, device = model.specials, src.device
    limit = sentence_limits(model, src, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)  # (B,)
    cache = model.init_cache(model.encode(src))
    columns = Columns(cache, never=sp.never_generated, device=device)
    if nbest > 1:  # each sample its own row of the cache, cross-attention included (group 1: it runs alone)
        expand = torch.arange(src.size(0), device=device).repeat_interleave(nbest)  # (B * n,)
        cache.reorder(expand, group=1, kept=expand)
        limit = limit[expand]
    limits = limit.tolist()  # the batch's one more sync: each row draws as many uniforms as it may decode tokens
    uniforms = torch.nn.utils.rnn.pad_sequence(
        [
            torch.rand(n, generator=sample_generator(sampling.seed, lines[row // nbest], row % nbest))
            for row, n in enumerate(limits)
        ],
        batch_first=True,
    ).to(device)  # (R, L) row r's uniform of step t at [r, t]: the same whatever the batch
    rows = torch.arange(len(limits), device=device)  # (R,) each running row's number
    tokens = torch.full((len(limits),), sp.start, dtype=torch.long, device=device)  # (R,) each row's newest token
    cum = torch.zeros(len(limits), dtype=torch.float32, device=device)  # (R,) summed model log-probs
    out = torch.empty(len(limits), max(limits), dtype=torch.long, device=device)  # (R, L) the tokens so far
    done: list[tuple[Tensor, Tensor, Tensor, int]] = []  # finished rows: row, tokens, log-prob, length
    step = 0
    while True:
        lprobs = columns.log_probs(model.decode_step(tokens, cache))  # (b, V or K)
        col = draw(lprobs, uniforms[:, step], sampling)  # (b,)
        cum = cum + lprobs.gather(1, col.unsqueeze(1)).squeeze(1)
        tokens = columns.ids_of(col)  # (b,)
        out[:, step] = tokens
        step += 1
        running = (tokens != sp.eos) & (limit > step)  # (b,)
        n = int(running.sum())  # the step's one host sync: the rows still running
        if n < running.size(0):
            ended = first_true(~running, running.size(0) - n)  # (e,)
            done.append((rows[ended], out[ended, :step], cum[ended], step))
            if n == 0:
                break
            keep = first_true(running, n)  # (b',)
            cache.reorder(keep, group=1, kept=keep)
            rows, tokens, limit = rows[keep], tokens[keep], limit[keep]
            cum, out, uniforms = cum[keep], out[keep], uniforms[keep]
    return _hypotheses(done, sentences=src.size(0), nbest=nbest, lenpen=lenpen, pad_id=sp.pad, eos=sp.eos)


def _hypotheses(
    done: list[tuple[Tensor, Tensor, Tensor, int]], *, sentences: int, nbest: int, lenpen: float, pad_id: int, eos: int
) -> list[list[Hypothesis]]:
    """The finished rows, read back at once, as each sentence's samples, best score first (equal scores: sample
    order)."""
    longest = max(length for *_, length in done)
    row = torch.cat([r for r, *_ in done])  # (N,)
    cum = torch.cat([c for _, _, c, _ in done])  # (N,)
    lengths = torch.cat([torch.full_like(r, length) for r, _, _, length in done])  # (N,) tokens incl. EOS
    tokens = torch.cat([pad(t, (0, longest - length), value=pad_id) for _, t, _, length in done])  # (N, L)
    scores = cum / length_penalty(lengths.float(), lenpen)  # (N,) float32
    ids_read = torch.cat([row.unsqueeze(1), lengths.unsqueeze(1), tokens], dim=1).tolist()  # (N, 2 + L): read once
    floats_read = torch.stack([scores, cum], dim=1).tolist()  # ... with the scores
    by_row: list[Hypothesis | None] = [None] * (sentences * nbest)
    for (r, n, *ids), (score, logprob) in zip(ids_read, floats_read):
        ids = ids[:n]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        by_row[r] = Hypothesis(tokens=ids, score=score, logprob=logprob)
    # every row ended once: no None is left
    samples: list[list[Hypothesis]] = [by_row[i * nbest : (i + 1) * nbest] for i in range(sentences)]  # type: ignore[misc]
    return [sorted(found, key=lambda h: -h.score) for found in samples]
