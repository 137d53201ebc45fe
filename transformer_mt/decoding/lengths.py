"""The length formulas of a search, each a small named function.

- :func:`length_penalty`: the GNMT normalisation a hypothesis' log-prob is divided by;
- :func:`max_output_length`: the longest output a source of n tokens may get, floor(a * n + b);
- :func:`positions_needed`: the position-table rows a batch of sources can use, encoder and decoder.
"""

from __future__ import annotations

import math
from typing import overload

import torch
from torch import Tensor


@overload
def length_penalty(length: Tensor, alpha: float) -> Tensor: ...
@overload
def length_penalty(length: float, alpha: float) -> float: ...
def length_penalty(length: float | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

    ``length`` counts generated tokens including EOS. alpha = 0 gives 1 (plain log-prob);
    alpha > 0 divides longer hypotheses' (negative) log-probs by more, favouring them. The
    penalty is 1 at length 1 and increases with length for alpha > 0. Works on ints, floats
    and tensors. A float result too large for a double is ``inf`` (as a tensor's is), never an OverflowError.
    """
    try:
        return ((5.0 + length) / 6.0) ** alpha
    except OverflowError:  # only floats raise; the penalty is positive, so its limit is +inf
        return math.inf


@overload
def max_output_length(src_tokens: int, *, max_len_a: float, max_len_b: int) -> int: ...
@overload
def max_output_length(src_tokens: Tensor, *, max_len_a: float, max_len_b: int) -> Tensor: ...
def max_output_length(src_tokens: int | Tensor, *, max_len_a: float, max_len_b: int) -> int | Tensor:
    """The longest output for a source of ``src_tokens`` tokens (pieces + EOS): floor(a * n + b), at least 1.

    The one formula of the rule, for an int or elementwise for a LongTensor of lengths (in float64, so it
    floors exactly as Python does on an int): the searches limit every sentence with it, and
    ``positions_needed`` sizes position tables with it. What a and b may be: ``config.length_problem``.
    """
    if isinstance(src_tokens, Tensor):
        return torch.floor(max_len_a * src_tokens.double() + max_len_b).long().clamp(min=1)
    return max(1, math.floor(max_len_a * src_tokens + max_len_b))


def positions_needed(longest_src: int, *, max_len_a: float, max_len_b: int) -> int:
    """Positions a batch can use: its longest source (pieces + EOS) in the encoder, and in the decoder its
    longest allowed output, ``max_output_length(n)`` for n up to ``longest_src``."""
    # a * n + b is linear in n: its largest value over 1..longest_src is at one of the two ends.
    return max(longest_src, *(max_output_length(n, max_len_a=max_len_a, max_len_b=max_len_b) for n in (1, longest_src)))
