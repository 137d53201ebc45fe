"""Greedy search: the most probable token at every step, over one batch or several, a batch's last rows carried
along with the next (the conventions shared with beam search are in :mod:`transformer_mt.decoding.search`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_mt.decoding.graphs import GraphedStep, StepRunner, step_runner
from transformer_mt.decoding.lengths import length_penalty
from transformer_mt.decoding.protocol import Hypothesis, JoinableCache, SearchCache, SearchModel
from transformer_mt.decoding.steps import Columns, check_inputs, first_true, sentence_limits


@torch.inference_mode()
def greedy_search(
    model: SearchModel[Any, Any],
    src: Tensor,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    lenpen: float = 0.0,
    max_output: int | None = None,
    static_cache: bool = False,
    graphs: GraphedStep | None = None,
) -> list[Hypothesis]:
    """Pick the most probable token at every step; one hypothesis per sentence of ``src`` (B, S).

    A sentence stops at its first EOS or at its maximum length; its row then leaves the batch
    (``cache.reorder`` with the rows still running). ``lenpen`` only changes the reported score.
    ``static_cache`` and ``graphs``: how the steps run (:func:`greedy_search_batches`).
    """
    return greedy_search_batches(
        model,
        [src],
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        lenpen=lenpen,
        max_output=max_output,
        static_cache=static_cache,
        graphs=graphs,
    )[0]


@torch.inference_mode()
def greedy_search_batches(
    model: SearchModel[Any, Any],
    srcs: Sequence[Tensor],
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    lenpen: float = 0.0,
    max_output: int | None = None,
    batch_tokens: int | None = None,
    static_cache: bool = False,
    graphs: GraphedStep | None = None,
) -> list[list[Hypothesis]]:
    """:func:`greedy_search` over several padded batches, in order: per batch, one hypothesis per sentence.

    A batch's last rows are its longest outputs, and run on alone for many steps at a cost per step that
    hardly depends on how few they are. So, when the cache can be joined (:class:`JoinableCache`) and
    ``batch_tokens`` is given, a batch whose running rows fill at most a quarter of ``batch_tokens``
    (rows x source width) is set aside while the next batch is searched from its start; on reaching the same
    step (the same position: the caches join row by row) the two go on as one batch, if they fit in
    ``batch_tokens``. Otherwise the set-aside rows go on alone after that batch. Each sentence is decoded as
    in its own batch: its tokens are the same, up to the float rounding that a batch's padding already
    brings. At most two batches' caches are held at a time.

    How the steps run (:mod:`transformer_mt.decoding.graphs`): on the model's growing cache (the default), on a static
    cache per batch (``static_cache``), or on ``graphs``' shared static buffers, replayed as CUDA graphs; the last two
    give the same tokens up to float rounding and never carry rows into the next batch.
    """
    for src in srcs:
        check_inputs(model, src)
    runner = step_runner(model, static_cache=static_cache, graphs=graphs)
    sp = model.specials
    offsets = np.cumsum([0] + [src.size(0) for src in srcs]).tolist()
    done: list[tuple[Tensor, Tensor, Tensor, int]] = []  # finished rows: sentence, tokens, log-prob, length
    current: _GreedyRows | None = None
    parked: _GreedyRows | None = None
    upcoming = [i for i, src in enumerate(srcs) if src.size(0)]
    with runner.session():  # a GraphedStep's buffers serve one search at a time
        while True:
            if current is None:
                if upcoming:
                    i = upcoming.pop(0)
                    current = _GreedyRows.start(
                        model,
                        runner,
                        srcs[i],
                        first=offsets[i],
                        max_len_a=max_len_a,
                        max_len_b=max_len_b,
                        max_output=max_output,
                    )
                elif parked is not None:
                    current, parked = parked, None
                else:
                    break
            if parked is not None and parked.step == current.step and batch_tokens is not None:
                if (current.size + parked.size) * max(current.width, parked.width) <= batch_tokens:
                    current, parked = current.joined(parked), None
            n = current.advance(model, done)  # the step's one host sync
            if n == 0:
                current = None
            elif (
                parked is None
                and upcoming
                and batch_tokens is not None
                and 4 * n * current.width <= batch_tokens
                and current.joinable
            ):
                parked, current = current, None
    return _greedy_hypotheses(done, offsets, lenpen=lenpen, pad=sp.pad, eos=sp.eos)


class _GreedyRows:
    """The running rows of greedy search, one per sentence, all at one step: their cache and, per row, the
    sentence it translates (numbered over all batches), its newest token, output limit, log-prob and tokens."""

    def __init__(
        self,
        runner: StepRunner,
        cache: SearchCache,
        columns: Columns,
        *,
        sent: Tensor,
        limit: Tensor,
        tokens: Tensor,
        cum: Tensor,
        out: Tensor,
        width: int,
        step: int,
    ):
        self.runner, self.cache, self.columns, self.width, self.step = runner, cache, columns, width, step
        self.sent, self.limit = sent, limit  # (b,) each row's sentence, numbered over all batches; its longest output
        self.tokens, self.cum = tokens, cum  # (b,) each row's newest token; its summed log-probs (float32)
        self.out = out  # (b, L) the tokens so far, L >= every row's limit

    @classmethod
    def start(
        cls,
        model: SearchModel[Any, Any],
        runner: StepRunner,
        src: Tensor,
        *,
        first: int,
        max_len_a: float,
        max_len_b: int,
        max_output: int | None,
    ) -> _GreedyRows:
        """The rows of a new batch ``src`` (B, S), sentences numbered from ``first``, nothing decoded yet."""
        rows, device = src.size(0), src.device
        limit = sentence_limits(model, src, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)  # (B,)
        longest = int(limit.max())
        cache = runner.init_cache(model.encode(src), max_len=longest, group=1)
        columns = Columns(cache, never=model.specials.never_generated, device=device)
        return cls(
            runner,
            cache,
            columns,
            sent=torch.arange(first, first + rows, device=device),
            limit=limit,
            tokens=torch.full((rows,), model.specials.start, dtype=torch.long, device=device),
            cum=torch.zeros(rows, dtype=torch.float32, device=device),
            out=torch.empty(rows, longest, dtype=torch.long, device=device),
            width=src.size(1),
            step=0,
        )

    @property
    def size(self) -> int:
        return self.sent.size(0)

    @property
    def joinable(self) -> bool:
        return self.runner.joins and isinstance(self.cache, JoinableCache)

    def joined(self, other: _GreedyRows) -> _GreedyRows:
        """These rows, then ``other``'s, as one batch at their common step."""
        cache = self.cache.joined(other.cache)  # type: ignore[attr-defined] # checked by `joinable`
        out = self.out.new_empty(self.size + other.size, max(self.out.size(1), other.out.size(1)))
        out[:, : self.step] = torch.cat([self.out[:, : self.step], other.out[:, : self.step]])
        return _GreedyRows(
            self.runner,
            cache,
            self.columns,
            sent=torch.cat([self.sent, other.sent]),
            limit=torch.cat([self.limit, other.limit]),
            tokens=torch.cat([self.tokens, other.tokens]),
            cum=torch.cat([self.cum, other.cum]),
            out=out,
            width=max(self.width, other.width),
            step=self.step,
        )

    def advance(self, model: SearchModel[Any, Any], done: list[tuple[Tensor, Tensor, Tensor, int]]) -> int:
        """Decode one step; rows that end (EOS or their limit) go to ``done`` and leave. Returns the rows left."""
        step, eos = self.step, model.specials.eos
        lprobs = self.columns.log_probs(self.runner.decode_step(self.tokens, self.cache))  # (b, V or K)
        # Rank cum + lprobs rather than lprobs alone: the same float32 sums beam search ranks,
        # so beam 1 breaks near-ties exactly as greedy does. max() returns the lowest tied id
        # (the lowest column: kept ids are ascending).
        self.cum, col = lprobs.add_(self.cum.unsqueeze(1)).max(dim=1)  # (b,), (b,)
        tok = self.columns.ids_of(col)  # (b,)
        self.out[:, step] = tok
        self.step = step + 1
        running = (tok != eos) & (self.limit > self.step)  # (b,)
        n = int(running.sum())  # the step's one host sync: the rows still running
        if n < running.size(0):
            ended = first_true(~running, running.size(0) - n)  # (e,) found on the device
            done.append((self.sent[ended], self.out[ended, : self.step], self.cum[ended], self.step))
            if n:
                keep = first_true(running, n)  # (b',)
                self.cache.reorder(keep, group=1, kept=keep)
                self.sent, tok, self.limit, self.cum, self.out = (
                    self.sent[keep],
                    tok[keep],
                    self.limit[keep],
                    self.cum[keep],
                    self.out[keep],
                )
        self.tokens = tok
        return n


def _greedy_hypotheses(
    done: list[tuple[Tensor, Tensor, Tensor, int]], offsets: list[int], *, lenpen: float, pad: int, eos: int
) -> list[list[Hypothesis]]:
    """The finished rows, read back at once, as hypotheses per batch in sentence order."""
    if not done:
        return [[] for _ in offsets[1:]]
    longest = max(length for *_, length in done)
    sent = torch.cat([s for s, *_ in done])  # (N,)
    cum = torch.cat([c for _, _, c, _ in done])  # (N,)
    lengths = torch.cat([torch.full_like(s, length) for s, _, _, length in done])  # (N,) tokens incl. EOS
    # (N, L): every row padded to the longest
    tokens = torch.cat([torch.nn.functional.pad(t, (0, longest - length), value=pad) for _, t, _, length in done])
    scores = cum / length_penalty(lengths.float(), lenpen)  # (N,) float32
    ids_read = torch.cat([sent.unsqueeze(1), lengths.unsqueeze(1), tokens], dim=1).tolist()  # (N, 2 + L): read once ...
    by_sentence: list[Hypothesis | None] = [None] * offsets[-1]
    floats_read = torch.stack([scores, cum], dim=1).tolist()  # ... with the scores
    for (i, n, *row), (score, logprob) in zip(ids_read, floats_read):
        ids = row[:n]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        by_sentence[i] = Hypothesis(tokens=ids, score=score, logprob=logprob)
    return [by_sentence[a:b] for a, b in zip(offsets, offsets[1:])]  # type: ignore[misc] # every sentence ended once
