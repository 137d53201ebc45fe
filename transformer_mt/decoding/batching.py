"""Translating id sequences in batches, in input order, and the text rules that feed them.

:func:`encode_sources` applies the Translator's rules to the input lines (an empty or whitespace-only line is not
encoded, a line over the model's length is truncated); :func:`translate_ids` sorts the sequences by length, cuts
them into batches of at most ``batch_tokens`` padded source tokens, runs
:func:`~transformer_mt.decoding.search.search_batches` (which picks greedy or beam search) and restores the input
order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from transformer_mt import runtime
from transformer_mt.data import source_tensor
from transformer_mt.decoding.graphs import GraphedStep
from transformer_mt.decoding.lengths import positions_needed
from transformer_mt.decoding.prefix import ForcedPrefix
from transformer_mt.decoding.protocol import Hypothesis
from transformer_mt.decoding.sampling import Sampling
from transformer_mt.decoding.search import search_batches
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.text import Tokenizer


def encode_sources(
    src_tok: Tokenizer, lines: list[str], *, max_src_tokens: int
) -> tuple[list[int], list[list[int]], int]:
    """The lines with text, by index; their pieces' ids, each cut to ``max_src_tokens``; and how many were cut."""
    keep = [i for i, line in enumerate(lines) if line.strip()]
    ids = src_tok.encode([lines[i] for i in keep])
    truncated = 0
    for n, seq in enumerate(ids):
        if len(seq) > max_src_tokens:
            ids[n] = seq[:max_src_tokens]
            truncated += 1
    return keep, ids, truncated


def translate_ids(
    model: Transformer | Ensemble,
    src_ids: list[list[int]],
    *,
    beam: int = 4,
    lenpen: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    batch_tokens: int = 4096,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    max_output: int | None = None,
    sampling: Sampling | None = None,
    lines: list[int] | None = None,
    graphs: GraphedStep | None = None,
    prefix: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """Translate id sequences (without EOS; it is appended here) and return n-best lists in input order.
    ``sampling``: ``nbest`` samples per sequence instead of a search, each sequence's seeded by its line number in
    ``lines`` (None: its index in ``src_ids``), so that the batches do not change them. ``graphs``: greedy and beam
    search on its static buffers and CUDA graphs (:class:`~transformer_mt.decoding.graphs.GraphedStep`). ``prefix``:
    the decoder's input starts [start, *prefix] (:class:`~transformer_mt.decoding.prefix.ForcedPrefix`, NLLB's target
    language; a Transformer on its growing cache), and the hypotheses hold the pieces after it.

    The model's sinusoid table is grown first if this call's longest source or output needs more positions
    (``reserve_positions``), never during decoding (a Translator's model was sized when loading: nothing to do),
    and a model already in eval mode is left in it (only a training model is switched to eval and back).
    """
    device = torch.device(device)
    if src_ids:
        needed = positions_needed(max(map(len, src_ids)) + 1, max_len_a=max_len_a, max_len_b=max_len_b)
        model.reserve_positions(needed + len(prefix))
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]), reverse=True)
    results: list[list[Hypothesis] | None] = [None] * len(src_ids)
    # validation during training; an eval-mode model (a Translator's, shared by threads) stays as it is
    was_training = model.training
    if was_training:
        model.eval()
    try:
        with torch.inference_mode(), runtime.autocast(device, dtype):
            chunks = list(_token_batches(order, src_ids, batch_tokens))
            # (B, S) each: pieces + EOS, right-padded
            srcs = [source_tensor([src_ids[i] for i in chunk], specials=model.specials).to(device) for chunk in chunks]
            found = search_batches(
                ForcedPrefix(model, prefix) if prefix else model,
                srcs,
                beam=beam,
                lenpen=lenpen,
                max_len_a=max_len_a,
                max_len_b=max_len_b,
                nbest=nbest,
                max_output=max_output,
                batch_tokens=batch_tokens,
                sampling=sampling,
                lines=[[i if lines is None else lines[i] for i in chunk] for chunk in chunks],
                graphs=None if prefix else graphs,
            )
            for chunk, hyps in zip(chunks, found):
                for i, nbest_list in zip(chunk, hyps):
                    results[i] = nbest_list
    finally:
        if was_training:
            model.train()
    return results  # type: ignore[return-value] # every index is in one chunk: no None is left


def _token_batches(order: list[int], src_ids: list[list[int]], batch_tokens: int) -> Iterator[list[int]]:
    """Consecutive runs of `order` (sorted longest first) whose padded size stays within `batch_tokens`."""
    chunk: list[int] = []
    for i in order:
        width = len(src_ids[chunk[0]]) + 1 if chunk else len(src_ids[i]) + 1
        if chunk and (len(chunk) + 1) * width > batch_tokens:
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk
