"""Greedy and beam search, outside the model, over its incremental decoding interface: :func:`search` (one batch) and
:func:`search_batches` (several) here, the one place that picks greedy or beam search, or sampling; greedy search in
:mod:`transformer_mt.decoding.greedy`, beam search in :mod:`transformer_mt.decoding.beam`, what both do at a step in
:mod:`transformer_mt.decoding.steps`, sampling (every token drawn, not searched for) in
:mod:`transformer_mt.decoding.sampling`.

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

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.graphs import GraphedStep
from transformer_mt.decoding.greedy import greedy_search_batches
from transformer_mt.decoding.protocol import BeamStep, Hypothesis, SearchModel
from transformer_mt.decoding.sampling import Sampling, sample_batches
from transformer_mt.decoding.steps import check_settings


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
    sampling: Sampling | None = None,
) -> list[list[Hypothesis]]:
    """Translate a padded batch ``src`` (B, S): beam 1 runs greedy search, larger beams beam search; ``sampling``
    draws ``nbest`` samples per sentence instead (beam 1; the sentences numbered from ``sampling.first_line``).

    Returns, per sentence in input order, ``nbest`` hypotheses, best score first. ``max_output`` caps every
    sentence's longest output below ``max_len_a`` x n + ``max_len_b`` (a server's limit). ``observer`` sees each
    beam-search step (beam > 1; see :func:`~transformer_mt.decoding.beam.beam_search`).
    """
    return search_batches(
        model,
        [src],
        beam=beam,
        lenpen=lenpen,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        nbest=nbest,
        max_output=max_output,
        observer=observer,
        sampling=sampling,
    )[0]


def search_batches(
    model: SearchModel[Any, Any],
    srcs: Sequence[Tensor],
    *,
    beam: int = 4,
    lenpen: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    max_output: int | None = None,
    batch_tokens: int | None = None,
    observer: Callable[[BeamStep], None] | None = None,
    sampling: Sampling | None = None,
    lines: Sequence[Sequence[int]] | None = None,
    static_cache: bool = False,
    graphs: GraphedStep | None = None,
) -> list[list[list[Hypothesis]]]:
    """:func:`search` over several padded batches, in order: per batch, per sentence, ``nbest`` hypotheses.

    With ``sampling``, each sentence's ``nbest`` independent samples
    (:func:`~transformer_mt.decoding.sampling.sample_batches`; the beam must be 1), seeded by each sentence's line
    number: ``lines`` gives them per batch (None: 0, 1, ... over the batches in order). Otherwise beam 1 with one
    hypothesis is greedy search, which carries a batch's last rows along with the next batch when they fit in
    ``batch_tokens`` (:func:`~transformer_mt.decoding.greedy.greedy_search_batches`); anything else is beam search,
    one batch at a time, which checks the settings (:func:`~transformer_mt.decoding.steps.check_settings`: a beam of 1
    with ``nbest`` 2 is refused there). ``static_cache`` / ``graphs``: greedy and beam search on preallocated
    key/value buffers, and with ``graphs`` each step replayed from a CUDA graph per batch bucket
    (:mod:`~transformer_mt.decoding.graphs`); the same hypotheses as the growing cache's.
    """
    if sampling is not None:
        check_settings(beam, nbest, lenpen=lenpen, sample=True)
        return sample_batches(
            model,
            srcs,
            sampling=sampling,
            nbest=nbest,
            lines=lines,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_output=max_output,
        )
    if beam == 1 and nbest == 1:
        found = greedy_search_batches(
            model,
            srcs,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_output=max_output,
            batch_tokens=batch_tokens,
            static_cache=static_cache,
            graphs=graphs,
        )
        return [[[hyp] for hyp in hyps] for hyps in found]
    return [
        beam_search(
            model,
            src,
            beam=beam,
            lenpen=lenpen,
            nbest=nbest,
            observer=observer,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_output=max_output,
            static_cache=static_cache,
            graphs=graphs,
        )
        for src in srcs
    ]
