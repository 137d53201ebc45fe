"""Greedy and beam search, outside the model, over its incremental decoding interface.

The model is used through the :class:`SearchModel` protocol only (both ``Transformer`` and ``Ensemble``
satisfy it; this module imports neither): ``encode`` once per batch, ``init_cache`` once,
``decode_step`` once per output position (the KV cache makes each step cost one position, never
the whole prefix), ``max_output_length`` once, and the cache's ``reorder(indices)``
(:class:`SearchCache`) to expand rows to beams, follow beam reshuffles and drop sentences that are
done, so late steps run on fewer rows. A search never changes the model, so one model can serve
several searches at once (threads).

Conventions shared by both searches (and by :class:`Hypothesis`):

- Special ids are the model's (``model.specials``, :class:`~transformer_mt.text.SpecialIds`): every row starts
  from ``start`` (BOS for the models tmt trains), ``eos`` ends a hypothesis, ``pad`` pads the source.
- ``tokens``: the generated ids, without the start id and without EOS.
- length: the number of generated tokens *including* EOS when the hypothesis has one. A
  hypothesis that reaches the maximum length without EOS is finished as is: its length is the
  maximum length and its log-prob contains no EOS term.
- ``logprob``: the sum of the log-probabilities of the generated tokens, EOS included.
- ``score``: ``logprob / length_penalty(length, alpha)``, the GNMT normalisation.
- Log-softmax runs in float32 even under bf16/fp16 autocast; pad, the start id and BOS are never generated.
- A model whose output layer keeps K of the V ids (``model.restrict_output``) is asked, through its cache
  (:class:`RestrictableCache`), for the K kept logits only: the log-softmax and the ranking then run over K
  columns, and the picked columns are mapped back to ids (the others' logits are -inf: they cannot be picked).
- Maximum output length per sentence: ``floor(a * n + b)`` with ``n`` the source's non-pad
  tokens (its EOS included), at least 1, and at most ``model.max_output_length()`` (the position table's size
  when the model has learned positions: the start plus the first L-1 outputs occupy positions 0..L-1).
- Ties between equal scores go to the lower token id (lower flat beam-major index in beam
  search), so beam size 1 with ``lenpen=0`` reproduces greedy search token for token. Between finished
  hypotheses of equal score, the one that finished first (earlier step, then better rank) is kept and
  listed first.

Host syncs (each one stalls a GPU; ``syncs.SyncCounter`` counts them, tests hold the numbers): one per
step, whatever the batch size and beam: the number of sentences (rows) still running, which sets the
shape of the next step. The rows that go on are then found on the device; finished hypotheses are
kept on the device (score, log-prob and where they finished), and their tokens are read back once, at
the end, from per-step back-pointers. A beam step whose top-2k cut-off falls among equal scores
(settled by index, below) costs one more. Per search: two or three more (the longest output, the results).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from transformer_mt.config import Problem, beam_problem
from transformer_mt.decoding.lengths import length_penalty, max_output_length
from transformer_mt.decoding.protocol import BeamStep, Hypothesis, JoinableCache, RestrictableCache, SearchCache, SearchError, SearchModel


def _refuse(problem: Problem | None) -> None:
    """Raise a search-settings rule's problem (transformer_mt.config.rules) as a SearchError."""
    if problem:
        raise SearchError(str(problem))


def _sentence_limits(model: SearchModel[Any, Any], src: Tensor, *, max_len_a: float, max_len_b: int, max_output: int | None = None) -> Tensor:
    """(B,) long: each sentence's longest output (its non-pad tokens), at most the model's own limit and ``max_output``."""
    lens = max_output_length((src != model.specials.pad).sum(dim=1), max_len_a=max_len_a, max_len_b=max_len_b)
    limits = [cap for cap in (model.max_output_length(), max_output) if cap is not None]
    return lens.clamp(max=min(limits)) if limits else lens


def search(
    model: SearchModel[Any, Any],
    src: Tensor,
    *,
    beam: int = 4,
    lenpen: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    max_output: int | None = None,
    observer: Callable[[BeamStep], None] | None = None,
) -> list[list[Hypothesis]]:
    """Translate a padded batch ``src`` (B, S): beam 1 runs greedy search, larger beams beam search.

    Returns, per sentence in input order, ``nbest`` hypotheses, best score first. ``max_output`` caps every
    sentence's longest output below ``max_len_a`` x n + ``max_len_b`` (a server's limit). ``observer`` sees each
    beam-search step (beam > 1; see :func:`beam_search`).
    """
    _refuse(beam_problem(beam, nbest))
    if beam == 1:
        return [[hyp] for hyp in greedy_search(model, src, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)]
    return beam_search(model, src, beam=beam, lenpen=lenpen, nbest=nbest, observer=observer, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)


@torch.inference_mode()
def greedy_search(
    model: SearchModel[Any, Any], src: Tensor, *, max_len_a: float = 1.0, max_len_b: int = 50, lenpen: float = 0.0, max_output: int | None = None
) -> list[Hypothesis]:
    """Pick the most probable token at every step; one hypothesis per sentence of ``src`` (B, S).

    A sentence stops at its first EOS or at its maximum length; its row then leaves the batch
    (``cache.reorder`` with the rows still running). ``lenpen`` only changes the reported score.
    """
    return greedy_search_batches(model, [src], max_len_a=max_len_a, max_len_b=max_len_b, lenpen=lenpen, max_output=max_output)[0]


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
    """
    for src in srcs:
        _check_inputs(model, src)
    sp = model.specials
    offsets = np.cumsum([0] + [src.size(0) for src in srcs]).tolist()
    done: list[tuple[Tensor, Tensor, Tensor, int]] = []  # finished rows: sentence, tokens, log-prob, length
    current: _GreedyRows | None = None
    parked: _GreedyRows | None = None
    upcoming = [i for i, src in enumerate(srcs) if src.size(0)]
    while True:
        if current is None:
            if upcoming:
                i = upcoming.pop(0)
                current = _GreedyRows.start(model, srcs[i], first=offsets[i], max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)
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
        elif parked is None and upcoming and batch_tokens is not None and 4 * n * current.width <= batch_tokens and current.joinable:
            parked, current = current, None
    return _greedy_hypotheses(done, offsets, lenpen=lenpen, pad=sp.pad, eos=sp.eos)


class _GreedyRows:
    """The running rows of greedy search, one per sentence, all at one step: their cache and, per row, the
    sentence it translates (numbered over all batches), its newest token, output limit, log-prob and tokens."""

    def __init__(self, cache: SearchCache, columns: _Columns, *, sent: Tensor, limit: Tensor, tokens: Tensor, cum: Tensor, out: Tensor, width: int, step: int):
        self.cache, self.columns, self.width, self.step = cache, columns, width, step
        self.sent, self.limit = sent, limit  # (b,) each row's sentence, numbered over all batches; its longest output
        self.tokens, self.cum = tokens, cum  # (b,) each row's newest token; its summed log-probs (float32)
        self.out = out  # (b, L) the tokens so far, L >= every row's limit

    @classmethod
    def start(cls, model: SearchModel[Any, Any], src: Tensor, *, first: int, max_len_a: float, max_len_b: int, max_output: int | None) -> _GreedyRows:
        """The rows of a new batch ``src`` (B, S), sentences numbered from ``first``, nothing decoded yet."""
        rows, device = src.size(0), src.device
        limit = _sentence_limits(model, src, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)  # (B,)
        cache = model.init_cache(model.encode(src))
        columns = _Columns(cache, never=model.specials.never_generated, device=device)
        return cls(
            cache,
            columns,
            sent=torch.arange(first, first + rows, device=device),
            limit=limit,
            tokens=torch.full((rows,), model.specials.start, dtype=torch.long, device=device),
            cum=torch.zeros(rows, dtype=torch.float32, device=device),
            out=torch.empty(rows, int(limit.max()), dtype=torch.long, device=device),
            width=src.size(1),
            step=0,
        )

    @property
    def size(self) -> int:
        return self.sent.size(0)

    @property
    def joinable(self) -> bool:
        return isinstance(self.cache, JoinableCache)

    def joined(self, other: _GreedyRows) -> _GreedyRows:
        """These rows, then ``other``'s, as one batch at their common step."""
        cache = self.cache.joined(other.cache)  # type: ignore[attr-defined] # checked by `joinable`
        out = self.out.new_empty(self.size + other.size, max(self.out.size(1), other.out.size(1)))
        out[:, : self.step] = torch.cat([self.out[:, : self.step], other.out[:, : self.step]])
        return _GreedyRows(
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
        lprobs = self.columns.log_probs(model.decode_step(self.tokens, self.cache))  # (b, V or K)
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
            ended = _first_true(~running, running.size(0) - n)  # (e,) found on the device
            done.append((self.sent[ended], self.out[ended, : self.step], self.cum[ended], self.step))
            if n:
                keep = _first_true(running, n)  # (b',)
                self.cache.reorder(keep, group=1, kept=keep)
                self.sent, tok, self.limit, self.cum, self.out = self.sent[keep], tok[keep], self.limit[keep], self.cum[keep], self.out[keep]
        self.tokens = tok
        return n


def _greedy_hypotheses(done: list[tuple[Tensor, Tensor, Tensor, int]], offsets: list[int], *, lenpen: float, pad: int, eos: int) -> list[list[Hypothesis]]:
    """The finished rows, read back at once, as hypotheses per batch in sentence order."""
    if not done:
        return [[] for _ in offsets[1:]]
    longest = max(length for *_, length in done)
    sent = torch.cat([s for s, *_ in done])  # (N,)
    cum = torch.cat([c for _, _, c, _ in done])  # (N,)
    lengths = torch.cat([torch.full_like(s, length) for s, _, _, length in done])  # (N,) tokens incl. EOS
    tokens = torch.cat([torch.nn.functional.pad(t, (0, longest - length), value=pad) for _, t, _, length in done])  # (N, L)
    scores = cum / length_penalty(lengths.float(), lenpen)  # (N,) float32
    ids_read = torch.cat([sent.unsqueeze(1), lengths.unsqueeze(1), tokens], dim=1).tolist()  # (N, 2 + L): read once ...
    by_sentence: list[Hypothesis | None] = [None] * offsets[-1]
    for (i, n, *row), (score, logprob) in zip(ids_read, torch.stack([scores, cum], dim=1).tolist()):  # ... with the scores
        ids = row[:n]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        by_sentence[i] = Hypothesis(tokens=ids, score=score, logprob=logprob)
    return [by_sentence[a:b] for a, b in zip(offsets, offsets[1:])]  # type: ignore[misc] # every sentence ended once


@torch.inference_mode()
def beam_search(
    model: SearchModel[Any, Any],
    src: Tensor,
    *,
    beam: int = 4,
    lenpen: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    max_output: int | None = None,
    observer: Callable[[BeamStep], None] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a padded batch ``src`` (B, S); per sentence ``nbest`` hypotheses, best first.

    Every sentence keeps ``beam`` open hypotheses (rows ``sentence * beam + j`` of the cache) and
    the best ``beam`` finished ones, set aside (:class:`_Finished`, on the device). Each step:

    1. scores every one-token extension, cum + log p, over beam * V (only beam 0 at step 0,
       where all beams hold the same start prefix), and takes the top 2 * beam;
    2. EOS extensions ranked within the top ``beam`` finish (fairseq's rule): there are at most
       ``beam`` EOS among the 2 * beam, so ``beam`` non-EOS candidates always remain to be the
       next open beams. Finished hypotheses leave the beam and never grow;
    3. at a sentence's maximum length its open beams finish as they are, without EOS;
    4. a sentence is done when it holds ``beam`` finished hypotheses and no open beam can still
       beat the worst of them (bound below), or at its maximum length; its rows leave the batch.

    Early-stop bound. An open beam with log-prob c <= 0 after t tokens finishes with a length L
    in [t + 1, max_len] and log-prob c' <= c (log-probs are <= 0), so its score is
    c' / lp(L) <= c / lp(L) <= c / max(lp(t + 1), lp(max_len)), the last because c <= 0 and lp is
    positive and monotone in L (increasing for alpha > 0, decreasing for alpha < 0, constant for
    alpha = 0). The best open beam has the largest c, so once that bound is <= the worst kept
    score, nothing left can enter the kept set (a newcomer must beat it strictly) and stopping
    early returns exactly what running every sentence to its maximum length would.

    Tokens are never copied per step: each step records, for every open row, the row it extends and
    the token it appends (back-pointers), and a finished hypothesis is (step, row, appended token or
    none); the token lists are rebuilt once, on the host, at the end.

    ``observer`` (None: nothing is done for it) is called with every settled step's :class:`BeamStep`, the
    tensors the step already holds, to show the search at work (`tmt explore`); it must not change them.
    """
    _check_inputs(model, src)
    _refuse(beam_problem(beam, nbest))
    batch, device, k, sp = src.size(0), src.device, beam, model.specials
    if batch == 0:
        return []
    max_lens = _sentence_limits(model, src, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)  # (B,)
    cache = model.init_cache(model.encode(src))
    columns = _Columns(cache, never=sp.never_generated, device=device)
    cache.reorder(torch.arange(batch, device=device).repeat_interleave(k), group=k)  # B -> B*k rows, sentence-major
    sent = torch.arange(batch, device=device)  # (b,) original sentence of each active sentence
    cum = torch.zeros(batch, k, dtype=torch.float32, device=device)  # (b, k) log-prob of each open beam
    tokens = torch.full((batch * k,), sp.start, dtype=torch.long, device=device)  # (b*k,) newest token
    finished = _Finished(batch, k, device=device)
    parents: list[Tensor] = []  # per step s >= 1: (rows of step s,) the row of step s - 1 each extends
    appended: list[Tensor] = []  # per step s >= 1: (rows of step s,) the token each appended
    rank = torch.arange(2 * k, device=device)  # (2k,)
    for step in range(int(max_lens.max())):
        b = sent.numel()
        lprobs = columns.log_probs(model.decode_step(tokens, cache))  # (b*k, V), or (b*k, K) over the kept ids
        vocab = lprobs.size(1)
        if step == 0:
            _refuse(beam_problem(beam, nbest, tgt_vocab_size=vocab))
        cand = lprobs.add_(cum.view(b * k, 1)).view(b, k, vocab)  # cum + log p: (b*k, V) -> (b, k, V)
        if step == 0:
            cand = cand[:, :1]  # (b, 1, V): the k beams are identical copies of the start
        scores = cand.reshape(b, -1)  # (b, k*V) flat beam-major
        top = _top_candidates(scores, 2 * k)
        ext = _extend(top, finished, sent=sent, max_lens=max_lens, k=k, columns=columns, vocab=vocab, step=step, lenpen=lenpen, rank=rank, eos=sp.eos)
        n_keep, n_tied = torch.stack([ext.keep.sum(), top.tied.sum()]).tolist()  # the step's one host sync
        if n_tied:  # rare: the cut-off of the top 2k fell among equal scores; settle it by index and redo the step
            top = _top_candidates(scores, 2 * k, n_tied=n_tied)
            ext = _extend(top, finished, sent=sent, max_lens=max_lens, k=k, columns=columns, vocab=vocab, step=step, lenpen=lenpen, rank=rank, eos=sp.eos)
            n_keep = int(ext.keep.sum())
        if observer is not None:
            observer(BeamStep(step, sent, ext.src_rows, ext.new_tok, ext.new_cum, ext.merged, max_lens[sent], ext.keep))
        finished.store(sent, ext.merged)
        if n_keep == 0:
            break
        if n_keep < b:  # drop the sentences that are done
            keep = _first_true(ext.keep, n_keep)  # (b',) found on the device
            rows, new_tok, cum, sent = ext.src_rows[keep].view(-1), ext.new_tok[keep].view(-1), ext.new_cum[keep], sent[keep]
        else:
            keep, rows, new_tok, cum = None, ext.src_rows.view(-1), ext.new_tok.view(-1), ext.new_cum
        cache.reorder(rows, group=k, kept=keep)  # (b'*k,) follow beams and drop finished sentences in one reorder
        parents.append(rows)
        appended.append(new_tok)
        tokens = new_tok
    return finished.hypotheses(parents, appended, nbest)


class _Top(NamedTuple):
    """The top 2k candidates of each active sentence, best first (ties: lower flat index first)."""

    score: Tensor  # (b, 2k) cum + log p
    flat: Tensor  # (b, 2k) flat index beam * V + token
    tied: Tensor  # (b,) bool: the cut-off fell among equal scores (settled only when n_tied was given)


class _Extension(NamedTuple):
    """One beam step's outcome for the active sentences, before anything is committed."""

    new_tok: Tensor  # (b, k) tokens that extend the next open beams
    new_cum: Tensor  # (b, k) their log-probs, best first
    src_rows: Tensor  # (b, k) the rows (of this step) they extend
    merged: tuple[Tensor, ...]  # the finished buffers of the active sentences after this step (see _Finished)
    keep: Tensor  # (b,) bool: sentences still searching


def _extend(
    top: _Top,
    finished: _Finished,
    *,
    sent: Tensor,
    max_lens: Tensor,
    k: int,
    columns: _Columns,
    vocab: int,
    step: int,
    lenpen: float,
    rank: Tensor,
    eos: int,
) -> _Extension:
    """Steps 2-4 of :func:`beam_search` on the device: next open beams, newly finished hypotheses merged
    into the kept ones, and which sentences go on. Pure: nothing is changed, so a step can be redone."""
    b, length = sent.numel(), step + 1  # length of every hypothesis extended at this step
    top_beam, top_tok = top.flat // vocab, columns.ids_of(top.flat % vocab)  # (b, 2k) source beam, new token
    is_eos = top_tok == eos  # (b, 2k)
    # Open continuations: the first k non-EOS candidates, in rank order.
    open_pos = (is_eos.long() * 2 * k + rank).argsort(dim=1)[:, :k]  # (b, k), keys distinct
    new_beam, new_tok = top_beam.gather(1, open_pos), top_tok.gather(1, open_pos)  # (b, k)
    new_cum = top.score.gather(1, open_pos)  # (b, k), sorted descending
    base = torch.arange(b, device=sent.device).unsqueeze(1) * k  # (b, 1) first row of each sentence
    src_rows = base + new_beam  # (b, k) rows of this step's cache
    limit = max_lens[sent]  # (b,)
    at_max = limit <= length  # (b,)
    lp = length_penalty(length, lenpen)
    # Candidates that finish now, per sentence in the order they arrive: EOS within the top k (rank
    # order; tokens = the prefix of their row), then at the length limit the k open beams as they are.
    no_token = torch.full_like(new_tok, -1)
    candidates = (
        torch.cat([top.score[:, :k] / lp, new_cum / lp], dim=1),  # (b, 2k) score
        torch.cat([top.score[:, :k], new_cum], dim=1),  # (b, 2k) log-prob
        torch.cat([base + top_beam[:, :k], src_rows], dim=1),  # (b, 2k) row of this step
        torch.cat([no_token, new_tok], dim=1),  # (b, 2k) appended token, -1 for EOS
        torch.cat([is_eos[:, :k], at_max.unsqueeze(1).expand(b, k)], dim=1),  # (b, 2k) really finished
    )
    merged = finished.merge(sent, candidates, step=step)
    # Largest penalty any continuation (final length length+1 .. max_len) can receive.
    shortest = torch.full((), length + 1.0, device=sent.device)
    most_lp = torch.maximum(length_penalty(shortest, lenpen), length_penalty(limit.float(), lenpen))  # (b,)
    score, valid = merged[0], merged[5]  # (b, k), best first
    hopeless = valid[:, k - 1] & (new_cum[:, 0] / most_lp <= score[:, k - 1])  # (b,)
    return _Extension(new_tok, new_cum, src_rows, merged, ~(at_max | hopeless))


class _Finished:
    """The best ``k`` finished hypotheses of every sentence, on the device, best first (ties: the one
    finished first). Per sentence and slot: score, log-prob, the step it finished at, its row at that
    step, the token appended at the length limit (-1 after EOS: the row's prefix is the hypothesis),
    and whether the slot holds one at all."""

    def __init__(self, batch: int, k: int, *, device: torch.device):
        self.k = k
        self.score = torch.full((batch, k), -math.inf, dtype=torch.float32, device=device)
        self.logprob = torch.zeros(batch, k, dtype=torch.float32, device=device)
        self.step = torch.zeros(batch, k, dtype=torch.long, device=device)
        self.row = torch.zeros(batch, k, dtype=torch.long, device=device)
        self.token = torch.full((batch, k), -1, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, k, dtype=torch.bool, device=device)

    def _fields(self) -> tuple[Tensor, ...]:
        return self.score, self.logprob, self.step, self.row, self.token, self.valid

    def merge(self, sent: Tensor, candidates: tuple[Tensor, ...], *, step: int) -> tuple[Tensor, ...]:
        """The kept hypotheses of sentences ``sent`` (b,) merged with ``candidates`` (score, log-prob, row,
        token, valid; each (b, c), in arrival order) finished at ``step``: the best k of both, by score,
        kept ones before newcomers and earlier before later on equal scores. Nothing is stored here."""
        score, logprob, row, token, valid = candidates
        kept = [f.index_select(0, sent) for f in self._fields()]  # (b, k) each
        fields = [torch.cat([old, new], dim=1) for old, new in zip(kept, (score, logprob, torch.full_like(row, step), row, token, valid))]  # (b, k + c)
        order = fields[0].argsort(dim=1, descending=True, stable=True)  # by score ...
        order = order.gather(1, (~fields[5].gather(1, order)).to(torch.uint8).argsort(dim=1, stable=True))  # ... real ones first
        order = order[:, : self.k]
        return tuple(f.gather(1, order) for f in fields)

    def store(self, sent: Tensor, merged: tuple[Tensor, ...]) -> None:
        for field, value in zip(self._fields(), merged):
            field.index_copy_(0, sent, value)

    def hypotheses(self, parents: list[Tensor], appended: list[Tensor], nbest: int) -> list[list[Hypothesis]]:
        """Per sentence its ``nbest`` best, tokens rebuilt from the back-pointers: one read from the device."""
        floats = torch.stack([self.score, self.logprob]).tolist()  # (2, B, k)
        n, sizes = self.step.numel(), [p.numel() for p in parents]
        fields = [f.flatten().long() for f in (self.step, self.row, self.token, self.valid)]
        flat = torch.cat(fields + parents + appended).cpu().numpy()  # one copy of every long to the host
        step, row, token, valid, *history = np.split(flat, np.cumsum([n] * 4 + sizes * 2)[:-1])
        parent, tok = history[: len(sizes)], history[len(sizes) :]
        # Walk every hypothesis back from its step to step 1: at step t its row appended tok[t - 1][row].
        longest = int(step.max(initial=0))
        ids = np.zeros((n, longest), dtype=np.int64)  # every entry read below is written first
        cur = row.copy()
        for t in range(longest, 0, -1):
            live = step >= t
            ids[live, t - 1] = tok[t - 1][cur[live]]
            cur[live] = parent[t - 1][cur[live]]
        out = []
        for s in range(self.score.size(0)):
            hyps: list[Hypothesis] = []
            for j in range(self.k):
                h = s * self.k + j
                if valid[h] and len(hyps) < nbest:
                    tokens = ids[h, : step[h]].tolist() + ([int(token[h])] if token[h] >= 0 else [])
                    hyps.append(Hypothesis(tokens=tokens, score=floats[0][s][j], logprob=floats[1][s][j]))
            out.append(hyps)
        return out


def _first_true(mask: Tensor, n: int) -> Tensor:
    """The indices of the ``n`` True entries of ``mask`` (m,), ascending, without asking the device for their
    number (``nonzero`` would: its output size is data-dependent); the caller read ``n`` already."""
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:n]


def _top_candidates(scores: Tensor, n: int, *, n_tied: int = 0) -> _Top:
    """The first ``n`` of each row of ``scores`` (b, N) in the order (score descending, index
    ascending). topk leaves ties unspecified, both which tied entries it picks at the cut-off and their
    order, so both are settled here; greedy's max() picks the lowest tied id too, which keeps beam 1
    equal to greedy even on exact ties. More entries tie with the n-th best score than topk kept exactly
    when the (n+1)-th best equals it (rare; one extra candidate costs less than a pass over ``scores``):
    ``tied`` marks those rows; given their number ``n_tied`` (read by the caller), they are settled by index."""
    values, indices = scores.topk(min(n + 1, scores.size(1)), dim=1)  # (b, n + 1)
    tied = values[:, n] == values[:, n - 1] if values.size(1) > n else torch.zeros_like(values[:, 0], dtype=torch.bool)  # (b,)
    values, indices = values[:, :n], indices[:, :n]
    if n_tied:
        ambiguous = _first_true(tied, n_tied)  # (a,)
        exact_values, exact_indices = scores[ambiguous].sort(dim=1, descending=True, stable=True)  # (a, N)
        values[ambiguous], indices[ambiguous] = exact_values[:, :n], exact_indices[:, :n]
    indices, order = indices.sort(dim=1)  # lower index first ...
    values, order = values.gather(1, order).sort(dim=1, descending=True, stable=True)  # ... then by score
    return _Top(values, indices.gather(1, order), tied)


class _Columns:
    """What the columns of ``decode_step``'s logits stand for: every id of the vocabulary, or, when the cache can
    restrict them (:class:`RestrictableCache`), the K ids the model's output layer keeps (ascending, so that a
    lower column is a lower id and ties still go to the lower id). The search then log-softmaxes and ranks K
    columns instead of V, and maps the columns it picks back to ids."""

    def __init__(self, cache: SearchCache, *, never: tuple[int, ...], device: torch.device):
        self.ids = cache.restrict_logits() if isinstance(cache, RestrictableCache) else None  # (K,) or None
        self.never = never  # the ids masked at every step (pad, the start id, BOS)
        if self.ids is not None and never:
            # Their columns, found on the device: a never-generated id the output layer does not keep is -inf
            # already, and the column searchsorted gives it (another id's) must stay as it is.
            wanted = torch.tensor(never, dtype=self.ids.dtype, device=device)  # (n,)
            self.never_cols = torch.searchsorted(self.ids, wanted).clamp_(max=self.ids.numel() - 1)  # (n,)
            self.never_kept = (self.ids[self.never_cols] == wanted).unsqueeze(0)  # (1, n)

    def log_probs(self, logits: Tensor) -> Tensor:
        """Float32 log-softmax of (rows, columns) logits, with the ids never generated made impossible."""
        with torch.autocast(device_type=logits.device.type, enabled=False):  # autocast must not lower it
            lprobs = torch.log_softmax(logits.float(), dim=-1)  # (rows, columns) float32
        # The probability mass of the masked ids stays in the sum: no renormalisation.
        if self.ids is None:
            for i in self.never:
                lprobs[:, i] = -math.inf
        elif self.never:
            lprobs[:, self.never_cols] = lprobs[:, self.never_cols].masked_fill(self.never_kept, -math.inf)  # (rows, n)
        return lprobs

    def ids_of(self, cols: Tensor) -> Tensor:
        """Column numbers (any shape) -> the ids they stand for."""
        return cols if self.ids is None else self.ids[cols]


def _check_inputs(model: SearchModel[Any, Any], src: Tensor) -> None:
    if model.training:
        raise SearchError("the model is in training mode (dropout on); call model.eval() before searching")
    if src.dim() != 2 or src.dtype != torch.long:
        raise SearchError(f"src must be a (batch, length) LongTensor of token ids, got shape {tuple(src.shape)} dtype {src.dtype}")
