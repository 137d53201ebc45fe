"""What greedy and beam search (and sampling) share at every step: what the columns of the model's logits stand for
and their float32 log-softmax (:class:`Columns`), each sentence's longest output, the rows still running found on the
device, the checks of a search's input, and :func:`check_settings`, the one check of the search settings' rules that
the searches and every translator call. The conventions they follow are in :mod:`transformer_mt.decoding.search`."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from transformer_mt.config import beam_problem, lenpen_problem
from transformer_mt.decoding.lengths import max_output_length
from transformer_mt.decoding.protocol import RestrictableCache, SearchCache, SearchError, SearchModel


def check_settings(
    beam: int, nbest: int = 1, *, lenpen: float | None = None, outputs: int | None = None, sample: bool = False
) -> None:
    """Refuse, as a SearchError worded ``beam=0 is out of range; ...``, settings that break the search rules of
    :mod:`transformer_mt.config.rules`: the beam and n-best bounds (``beam_problem``; with ``sample``, sampling's:
    beam 1, any number of samples), the beam limit of ``outputs`` ids when that count is known, then the length
    penalty when ``lenpen`` is given (``lenpen_problem``).

    Beam search calls it before anything is allocated and again at its first step, where the model's logits tell
    the number of ids it scores; a translator calls it with its target vocabulary and the length penalty before
    encoding a line (``checked_request``)."""
    problem = beam_problem(beam, nbest, tgt_vocab_size=outputs, sample=sample) or (
        None if lenpen is None else lenpen_problem(lenpen)
    )
    if problem:
        raise SearchError(str(problem))


def sentence_limits(
    model: SearchModel[Any, Any], src: Tensor, *, max_len_a: float, max_len_b: int, max_output: int | None = None
) -> Tensor:
    """(B,) long: each sentence's longest output (from its non-pad tokens), at most the model's own limit and
    ``max_output``."""
    lens = max_output_length((src != model.specials.pad).sum(dim=1), max_len_a=max_len_a, max_len_b=max_len_b)
    limits = [cap for cap in (model.max_output_length(), max_output) if cap is not None]
    return lens.clamp(max=min(limits)) if limits else lens


def first_true(mask: Tensor, n: int) -> Tensor:
    """The indices of the ``n`` True entries of ``mask`` (m,), ascending, without asking the device for their
    number (``nonzero`` would: its output size is data-dependent); the caller read ``n`` already."""
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:n]


class Columns:
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


def check_inputs(model: SearchModel[Any, Any], src: Tensor) -> None:
    if model.training:
        raise SearchError("the model is in training mode (dropout on); call model.eval() before searching")
    if src.dim() != 2 or src.dtype != torch.long:
        raise SearchError(
            f"src must be a (batch, length) LongTensor of token ids, got shape {tuple(src.shape)} dtype {src.dtype}"
        )
