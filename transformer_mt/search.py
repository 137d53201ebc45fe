"""Greedy and beam search, outside the model, over its incremental decoding interface.

The model is used through the :class:`SearchModel` protocol only (both ``Transformer`` and ``Ensemble``
satisfy it; this module imports neither): ``encode`` once per batch, ``init_cache`` once,
``decode_step`` once per output position (the KV cache makes each step cost one position, never
the whole prefix), ``max_output_length`` once, and the cache's ``reorder(indices)``
(:class:`SearchCache`) to expand rows to beams, follow beam reshuffles and drop sentences that are
done, so late steps run on fewer rows. A search never changes the model, so one model can serve
several searches at once (threads).

Conventions shared by both searches (and by :class:`Hypothesis`):

- ``tokens``: the generated ids, without BOS and without EOS.
- length: the number of generated tokens *including* EOS when the hypothesis has one. A
  hypothesis that reaches the maximum length without EOS is finished as is: its length is the
  maximum length and its log-prob contains no EOS term.
- ``logprob``: the sum of the log-probabilities of the generated tokens, EOS included.
- ``score``: ``logprob / length_penalty(length, alpha)``, the GNMT normalisation.
- Log-softmax runs in float32 even under bf16/fp16 autocast; PAD and BOS are never generated.
- Maximum output length per sentence: ``floor(a * n + b)`` with ``n`` the source's non-pad
  tokens (its EOS included), at least 1, and at most ``model.max_output_length()`` (the position table's size
  when the model has learned positions: BOS plus the first L-1 outputs occupy positions 0..L-1).
- Ties between equal scores go to the lower token id (lower flat beam-major index in beam
  search), so beam size 1 with ``lenpen=0`` reproduces greedy search token for token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor

from transformer_mt.errors import TmtError

from .tokenizer import BOS_ID, EOS_ID, PAD_ID


@runtime_checkable
class SearchCache(Protocol):
    """The decoding state of one batch, made by ``SearchModel.init_cache`` and owned by the search."""

    def reorder(self, indices: Tensor) -> None:
        """Row i becomes old row ``indices[i]`` (LongTensor (R',), any R'): expand to beams, follow beam
        reshuffles, drop finished rows."""
        ...


EncT = TypeVar("EncT")  # whatever encode returns and init_cache takes (EncoderOut; a list of them for an ensemble)
CacheT = TypeVar("CacheT", bound=SearchCache)


@runtime_checkable
class SearchModel(Protocol[EncT, CacheT]):
    """What greedy and beam search need from a model (``Transformer``, ``Ensemble``), nothing more."""

    training: bool  # searching refuses a model in training mode (dropout on)

    def encode(self, src: Tensor) -> EncT:
        """src (B, S) token ids, PAD-padded, each row ending in EOS -> the encoder's output for the batch."""
        ...

    def init_cache(self, enc: EncT) -> CacheT:
        """A fresh cache for the batch, one row per sentence, nothing decoded yet."""
        ...

    def decode_step(self, tokens: Tensor, cache: CacheT) -> Tensor:
        """tokens (R,): the newest token of each cache row (BOS first) -> (R, V) logits (or log-probs) of
        the next token; the cache advances by one position."""
        ...

    def max_output_length(self) -> int | None:
        """The longest output the model can produce (a learned position table's size), or None."""
        ...


@dataclass
class Hypothesis:
    """One finished translation of one source sentence."""

    tokens: list[int]  # generated ids, without BOS and EOS
    score: float  # logprob / length_penalty(length, alpha); length counts EOS when present
    logprob: float  # sum of token log-probs, EOS included when present


class SearchError(TmtError, ValueError):
    """A search request that cannot be honoured, worded for the user."""


def max_beam(tgt_vocab_size: int) -> int:
    """The largest beam a target vocabulary allows: each step ranks 2 * beam candidates among the ids
    that can follow a prefix (all but PAD and BOS), so beam <= (V - 2) / 2; greedy (beam 1) always works."""
    return max(1, (tgt_vocab_size - 2) // 2)


def check_beam(beam: int, nbest: int, *, tgt_vocab_size: int) -> None:
    """Refuse a beam / nbest pair that search cannot honour, before anything is encoded or allocated."""
    if beam < 1 or not 1 <= nbest <= beam:
        raise SearchError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam} nbest={nbest}")
    if beam > max_beam(tgt_vocab_size):
        raise SearchError(f"beam={beam} needs a target vocabulary of at least {2 * beam + 2} ids, the model has {tgt_vocab_size}; "
                          f"use a beam of at most {max_beam(tgt_vocab_size)}")


def length_penalty(length: int | float | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

    ``length`` counts generated tokens including EOS. alpha = 0 gives 1 (plain log-prob);
    alpha > 0 divides longer hypotheses' (negative) log-probs by more, favouring them. The
    penalty is 1 at length 1 and increases with length for alpha > 0. Works on ints, floats
    and tensors.
    """
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src: Tensor, *, max_len_a: float, max_len_b: int, limit: int | None = None) -> Tensor:
    """Longest output per sentence: floor(a * non-pad source tokens + b), in [1, limit]; (B,) long."""
    src_len = (src != PAD_ID).sum(dim=1).double()  # (B,) double, so a * n + b floors as in Python
    lens = torch.floor(max_len_a * src_len + max_len_b).long().clamp(min=1)
    if limit is not None:
        lens = lens.clamp(max=limit)
    return lens


def search(model: SearchModel[Any, Any], src: Tensor, *, beam: int = 4, lenpen: float = 0.6, max_len_a: float = 1.0,
           max_len_b: int = 50, nbest: int = 1) -> list[list[Hypothesis]]:
    """Translate a padded batch ``src`` (B, S): beam 1 runs greedy search, larger beams beam search.

    Returns, per sentence in input order, ``nbest`` hypotheses, best score first.
    """
    if beam == 1:
        if nbest != 1:
            raise SearchError(f"nbest={nbest} needs beam >= nbest; greedy search (beam 1) gives one hypothesis")
        return [[hyp] for hyp in greedy_search(model, src, max_len_a=max_len_a, max_len_b=max_len_b, lenpen=lenpen)]
    return beam_search(model, src, beam=beam, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest)


@torch.inference_mode()
def greedy_search(model: SearchModel[Any, Any], src: Tensor, *, max_len_a: float = 1.0, max_len_b: int = 50,
                  lenpen: float = 0.0) -> list[Hypothesis]:
    """Pick the most probable token at every step; one hypothesis per sentence of ``src`` (B, S).

    A sentence stops at its first EOS or at its maximum length; its row then leaves the batch
    (``cache.reorder`` with the rows still running). ``lenpen`` only changes the reported score.
    """
    _check_inputs(model, src)
    batch, device = src.size(0), src.device
    if batch == 0:
        return []
    max_lens = max_output_lengths(src, max_len_a=max_len_a, max_len_b=max_len_b, limit=model.max_output_length())  # (B,)
    cache = model.init_cache(model.encode(src))
    alive = torch.arange(batch, device=device)  # (b,) original sentence of each cache row
    tokens = torch.full((batch,), BOS_ID, dtype=torch.long, device=device)  # (b,) newest token per row
    out = torch.full((batch, int(max_lens.max())), PAD_ID, dtype=torch.long, device=device)  # (B, L)
    cum = torch.zeros(batch, dtype=torch.float32, device=device)  # (B,) summed log-probs
    lengths = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) generated tokens incl. EOS
    alive_max = max_lens
    for step in range(out.size(1)):
        lprobs = _log_probs(model.decode_step(tokens, cache))  # (b, V)
        # Rank cum + lprobs rather than lprobs alone: the same float32 sums beam search ranks,
        # so beam 1 breaks near-ties exactly as greedy does. max() returns the lowest tied id.
        best, tok = lprobs.add_(cum[alive].unsqueeze(1)).max(dim=1)  # (b,), (b,)
        out[alive, step] = tok
        cum[alive] = best
        done = (tok == EOS_ID) | (alive_max <= step + 1)  # (b,)
        if bool(done.any()):
            lengths[alive[done]] = step + 1
            keep = (~done).nonzero().squeeze(1)  # (b',) rows still running
            if keep.numel() == 0:
                break
            cache.reorder(keep)
            alive, tok, alive_max = alive[keep], tok[keep], alive_max[keep]
        tokens = tok
    scores = cum / length_penalty(lengths.float(), lenpen)  # (B,) float32
    hyps = []
    for row, n, score, logprob in zip(out.tolist(), lengths.tolist(), scores.tolist(), cum.tolist()):
        ids = row[:n]
        if ids and ids[-1] == EOS_ID:
            ids = ids[:-1]
        hyps.append(Hypothesis(tokens=ids, score=score, logprob=logprob))
    return hyps


@torch.inference_mode()
def beam_search(model: SearchModel[Any, Any], src: Tensor, *, beam: int = 4, lenpen: float = 0.6, max_len_a: float = 1.0,
                max_len_b: int = 50, nbest: int = 1) -> list[list[Hypothesis]]:
    """Beam search over a padded batch ``src`` (B, S); per sentence ``nbest`` hypotheses, best first.

    Every sentence keeps ``beam`` open hypotheses (rows ``sentence * beam + j`` of the cache) and
    up to ``beam`` finished ones, set aside. Each step:

    1. scores every one-token extension, cum + log p, over beam * V (only beam 0 at step 0,
       where all beams hold the same BOS prefix), and takes the top 2 * beam;
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
    """
    _check_inputs(model, src)
    if beam < 1 or not 1 <= nbest <= beam:
        raise SearchError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam} nbest={nbest}")
    batch, device, k = src.size(0), src.device, beam
    if batch == 0:
        return []
    max_lens = max_output_lengths(src, max_len_a=max_len_a, max_len_b=max_len_b, limit=model.max_output_length())  # (B,)
    cache = model.init_cache(model.encode(src))
    cache.reorder(torch.arange(batch, device=device).repeat_interleave(k))  # B -> B*k rows, sentence-major
    sent = torch.arange(batch, device=device)  # (b,) original sentence of each active sentence
    cum = torch.zeros(batch, k, dtype=torch.float32, device=device)  # (b, k) log-prob of each open beam
    seqs = torch.zeros(batch * k, 0, dtype=torch.long, device=device)  # (b*k, t) tokens of each open beam
    tokens = torch.full((batch * k,), BOS_ID, dtype=torch.long, device=device)  # (b*k,) newest token
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    n_done = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) finished hypotheses kept
    worst = torch.full((batch,), -math.inf, dtype=torch.float32, device=device)  # (B,) worst kept score once n_done == k
    rank = torch.arange(2 * k, device=device)  # (2k,)
    for step in range(int(max_lens.max())):
        b, length = sent.numel(), step + 1  # length of every hypothesis extended at this step
        lprobs = _log_probs(model.decode_step(tokens, cache))  # (b*k, V)
        vocab = lprobs.size(1)
        if step == 0:
            check_beam(beam, nbest, tgt_vocab_size=vocab)
        cand = lprobs.add_(cum.view(b * k, 1)).view(b, k, vocab)  # cum + log p: (b*k, V) -> (b, k, V)
        if step == 0:
            cand = cand[:, :1]  # (b, 1, V): the k beams are identical copies of BOS
        top_score, top_flat = _top_candidates(cand.reshape(b, -1), 2 * k)  # (b, 2k) best first
        top_beam, top_tok = top_flat // vocab, top_flat % vocab  # (b, 2k) source beam, new token
        is_eos = top_tok == EOS_ID  # (b, 2k)
        # Open continuations: the first k non-EOS candidates, in rank order.
        open_pos = (is_eos.long() * 2 * k + rank).argsort(dim=1)[:, :k]  # (b, k), keys distinct
        new_beam, new_tok = top_beam.gather(1, open_pos), top_tok.gather(1, open_pos)  # (b, k)
        new_cum = top_score.gather(1, open_pos)  # (b, k), sorted descending
        src_rows = torch.arange(b, device=device).unsqueeze(1) * k + new_beam  # (b, k) rows of seqs/cache
        at_max = max_lens[sent] <= length  # (b,)

        # Finishing: the only per-hypothesis Python, run only when something finishes.
        eos_in_beam = is_eos[:, :k]  # (b, k)
        if bool(eos_in_beam.any()):
            i, r = eos_in_beam.nonzero(as_tuple=True)
            rows = (i * k + top_beam[i, r]).tolist()
            logprobs = top_score[i, r]
            _keep_finished(finished, n_done, worst, k, sent[i].tolist(), [seqs[row].tolist() for row in rows],
                           logprobs.tolist(), (logprobs / length_penalty(length, lenpen)).tolist())
        if bool(at_max.any()):
            i = at_max.nonzero().squeeze(1)  # (m,) sentences at their length limit
            ends = torch.cat([seqs[src_rows[i].view(-1)], new_tok[i].view(-1, 1)], dim=1)  # (m*k, length)
            logprobs = new_cum[i].view(-1)  # (m*k,)
            _keep_finished(finished, n_done, worst, k, sent[i].repeat_interleave(k).tolist(), ends.tolist(),
                           logprobs.tolist(), (logprobs / length_penalty(length, lenpen)).tolist())

        # Largest penalty any continuation (final length length+1 .. max_len) can receive.
        most_lp = torch.maximum(length_penalty(torch.tensor(length + 1.0, device=device), lenpen),
                                length_penalty(max_lens[sent].float(), lenpen))  # (b,)
        hopeless = (n_done[sent] >= k) & (new_cum[:, 0] / most_lp <= worst[sent])  # (b,)
        keep = (~(at_max | hopeless)).nonzero().squeeze(1)  # (b',) sentences still searching
        if keep.numel() == 0:
            break
        rows = src_rows[keep].view(-1)  # (b'*k,) follow beams and drop finished sentences in one reorder
        cache.reorder(rows)
        seqs = torch.cat([seqs[rows], new_tok[keep].view(-1, 1)], dim=1)  # (b'*k, t + 1)
        tokens = new_tok[keep].view(-1)  # (b'*k,)
        cum, sent = new_cum[keep], sent[keep]
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


def _keep_finished(finished: list[list[Hypothesis]], n_done: Tensor, worst: Tensor, k: int, sents: list[int],
                   token_lists: list[list[int]], logprobs: list[float], scores: list[float]) -> None:
    """Add finished hypotheses, keeping the best k per sentence (a newcomer must beat the worst strictly)."""
    for s, ids, logprob, score in zip(sents, token_lists, logprobs, scores):
        kept = finished[s]
        hyp = Hypothesis(tokens=ids, score=score, logprob=logprob)
        if len(kept) < k:
            kept.append(hyp)
        else:
            low = min(range(k), key=lambda j: kept[j].score)
            if score <= kept[low].score:
                continue
            kept[low] = hyp
        n_done[s] = len(kept)
        if len(kept) == k:
            worst[s] = min(h.score for h in kept)


def _top_candidates(scores: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The first ``n`` of each row of ``scores`` (b, N) in the order (score descending, index
    ascending): (b, n) values and indices. topk leaves ties unspecified, both which tied entries it
    picks at the cut-off and their order, so both are settled here; greedy's max() picks the lowest
    tied id too, which keeps beam 1 equal to greedy even on exact ties."""
    values, indices = scores.topk(min(n + 1, scores.size(1)), dim=1)  # (b, n + 1)
    # More entries tie with the n-th best score than topk kept exactly when the (n+1)-th best equals it
    # (rare): those rows are settled by index. One extra candidate costs less than a pass over ``scores``.
    ambiguous = (values[:, n] == values[:, n - 1]).nonzero().squeeze(1) if values.size(1) > n else values.new_empty(0, dtype=torch.long)
    values, indices = values[:, :n], indices[:, :n]
    if ambiguous.numel():
        exact_values, exact_indices = scores[ambiguous].sort(dim=1, descending=True, stable=True)  # (a, N)
        values[ambiguous], indices[ambiguous] = exact_values[:, :n], exact_indices[:, :n]
    indices, order = indices.sort(dim=1)  # lower index first ...
    values, order = values.gather(1, order).sort(dim=1, descending=True, stable=True)  # ... then by score
    return values, indices.gather(1, order)


def _log_probs(logits: Tensor) -> Tensor:
    """Float32 log-softmax of (rows, V) logits, with PAD and BOS made impossible to generate."""
    with torch.autocast(device_type=logits.device.type, enabled=False):  # autocast must not lower it
        lprobs = torch.log_softmax(logits.float(), dim=-1)  # (rows, V) float32
    lprobs[:, PAD_ID] = -math.inf  # the probability mass stays in the sum: no renormalisation
    lprobs[:, BOS_ID] = -math.inf
    return lprobs


def _check_inputs(model: SearchModel[Any, Any], src: Tensor) -> None:
    if model.training:
        raise SearchError("the model is in training mode (dropout on); call model.eval() before searching")
    if src.dim() != 2 or src.dtype != torch.long:
        raise SearchError(f"src must be a (batch, length) LongTensor of token ids, got shape {tuple(src.shape)} dtype {src.dtype}")
