"""Beam search over one padded batch, outside the model, through the :class:`SearchModel` protocol.

The algorithm and its early-stop bound are in :func:`beam_search`'s docstring; the conventions it shares with
greedy search (special ids, lengths, scores, ties, host syncs) in :mod:`transformer_mt.decoding.search`, where
``search`` picks greedy or beam. Finished hypotheses are kept on the device (:class:`_Finished`) and their tokens
rebuilt once, at the end, from per-step back-pointers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from transformer_mt.decoding.graphs import GraphedStep, step_runner
from transformer_mt.decoding.lengths import length_penalty
from transformer_mt.decoding.protocol import BeamStep, Hypothesis, SearchModel
from transformer_mt.decoding.steps import Columns, check_inputs, check_settings, first_true, sentence_limits


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
    static_cache: bool = False,
    graphs: GraphedStep | None = None,
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

    How the steps run (:mod:`transformer_mt.decoding.graphs`): on the model's growing cache (the default), on a static
    cache (``static_cache``), or on ``graphs``' shared static buffers, replayed as CUDA graphs; the same hypotheses
    up to float rounding.
    """
    check_settings(beam, nbest)  # the vocabulary's bound too, at step 0, once the logits show how many ids there are
    check_inputs(model, src)
    batch, device, k, sp = src.size(0), src.device, beam, model.specials
    if batch == 0:
        return []
    max_lens = sentence_limits(model, src, max_len_a=max_len_a, max_len_b=max_len_b, max_output=max_output)  # (B,)
    longest = int(max_lens.max())
    runner = step_runner(model, static_cache=static_cache, graphs=graphs)
    with runner.session():  # a GraphedStep's buffers serve one search at a time
        cache = runner.init_cache(model.encode(src), max_len=longest, group=k)
        columns = Columns(cache, never=sp.never_generated, device=device)
        cache.reorder(torch.arange(batch, device=device).repeat_interleave(k), group=k)  # B -> B*k rows, sentence-major
        sent = torch.arange(batch, device=device)  # (b,) original sentence of each active sentence
        cum = torch.zeros(batch, k, dtype=torch.float32, device=device)  # (b, k) log-prob of each open beam
        tokens = torch.full((batch * k,), sp.start, dtype=torch.long, device=device)  # (b*k,) newest token
        finished = _Finished(batch, k, device=device)
        parents: list[Tensor] = []  # per step s >= 1: (rows of step s,) the row of step s - 1 each extends
        appended: list[Tensor] = []  # per step s >= 1: (rows of step s,) the token each appended
        rank = torch.arange(2 * k, device=device)  # (2k,)
        for step in range(longest):
            b = sent.numel()
            lprobs = columns.log_probs(runner.decode_step(tokens, cache))  # (b*k, V), or (b*k, K) over the kept ids
            vocab = lprobs.size(1)
            if step == 0:  # the ids the model scores are known now: the beam must leave k non-EOS among the top 2k
                check_settings(beam, nbest, outputs=vocab)
            cand = lprobs.add_(cum.view(b * k, 1)).view(b, k, vocab)  # cum + log p: (b*k, V) -> (b, k, V)
            if step == 0:
                cand = cand[:, :1]  # (b, 1, V): the k beams are identical copies of the start
            scores = cand.reshape(b, -1)  # (b, k*V) flat beam-major
            # steps 2-4 for this step's candidates: pure, so a step whose top-2k cut-off tied can be redone
            extend = partial(
                _extend,
                finished=finished,
                sent=sent,
                max_lens=max_lens,
                k=k,
                columns=columns,
                vocab=vocab,
                step=step,
                lenpen=lenpen,
                rank=rank,
                eos=sp.eos,
            )
            top = _top_candidates(scores, 2 * k)
            ext = extend(top)
            n_keep, n_tied = torch.stack([ext.keep.sum(), top.tied.sum()]).tolist()  # the step's one host sync
            if n_tied:  # rare: the cut-off of the top 2k fell among equal scores; settle it by index and redo the step
                top = _top_candidates(scores, 2 * k, n_tied=n_tied)
                ext = extend(top)
                n_keep = int(ext.keep.sum())
            if observer is not None:
                limits = max_lens[sent]
                observer(BeamStep(step, sent, ext.src_rows, ext.new_tok, ext.new_cum, ext.merged, limits, ext.keep))
            finished.store(sent, ext.merged)
            if n_keep == 0:
                break
            if n_keep < b:  # drop the sentences that are done
                keep = first_true(ext.keep, n_keep)  # (b',) found on the device
                rows, new_tok, cum, sent = (
                    ext.src_rows[keep].view(-1),
                    ext.new_tok[keep].view(-1),
                    ext.new_cum[keep],
                    sent[keep],
                )
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
    columns: Columns,
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
        fields = [
            torch.cat([old, new], dim=1)
            for old, new in zip(kept, (score, logprob, torch.full_like(row, step), row, token, valid))
        ]  # (b, k + c)
        order = fields[0].argsort(dim=1, descending=True, stable=True)  # by score ...
        real_first = (~fields[5].gather(1, order)).to(torch.uint8).argsort(dim=1, stable=True)
        order = order.gather(1, real_first)  # ... real ones first
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


def _top_candidates(scores: Tensor, n: int, *, n_tied: int = 0) -> _Top:
    """The first ``n`` of each row of ``scores`` (b, N) in the order (score descending, index
    ascending). topk leaves ties unspecified, both which tied entries it picks at the cut-off and their
    order, so both are settled here; greedy's max() picks the lowest tied id too, which keeps beam 1
    equal to greedy even on exact ties. More entries tie with the n-th best score than topk kept exactly
    when the (n+1)-th best equals it (rare; one extra candidate costs less than a pass over ``scores``):
    ``tied`` marks those rows; given their number ``n_tied`` (read by the caller), they are settled by index."""
    values, indices = scores.topk(min(n + 1, scores.size(1)), dim=1)  # (b, n + 1)
    if values.size(1) > n:
        tied = values[:, n] == values[:, n - 1]  # (b,)
    else:
        tied = torch.zeros_like(values[:, 0], dtype=torch.bool)  # (b,)
    values, indices = values[:, :n], indices[:, :n]
    if n_tied:
        ambiguous = first_true(tied, n_tied)  # (a,)
        exact_values, exact_indices = scores[ambiguous].sort(dim=1, descending=True, stable=True)  # (a, N)
        values[ambiguous], indices[ambiguous] = exact_values[:, :n], exact_indices[:, :n]
    indices, order = indices.sort(dim=1)  # lower index first ...
    values, order = values.gather(1, order).sort(dim=1, descending=True, stable=True)  # ... then by score
    return _Top(values, indices.gather(1, order), tied)
