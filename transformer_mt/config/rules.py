"""The rules on search settings, each checked by one function that every layer calls.

The config (``decode.*``, ``train.valid_beam``), the command line (``--beam``, ``--nbest``, ``--lenpen``, sampling's
``--temperature``, ``--top-k``, ``--top-p``, ``--epsilon``, ``--seed``),
the HTTP server (``beam``, ``nbest``), the :class:`~transformer_mt.decoding.Translator` and the search
itself all ask the same functions. A function returns ``None`` when the settings are fine, or the
:class:`Problem` with the first one that is not; each caller words it with the name its user typed
and raises its own error type (ConfigError, SearchError, a one-line CLI error, an HTTP 422).

The formula of the longest output, ``floor(max_len_a * n + max_len_b)``, is computed where tensors
are (``transformer_mt.decoding.max_output_length``); here is what its two settings may be.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from transformer_mt.config.sections import ModelConfig


class Problem(NamedTuple):
    """A setting a rule refuses: its key (as the rule names it), its value, and why, with the fix."""

    key: str  # beam, nbest, lenpen, max_len_a, max_len_b, or a sampling setting (temperature, top_k, ...)
    value: Any
    reason: str  # worded to follow the value: "is out of range; use ..."

    def __str__(self) -> str:
        """The library's wording, ``beam=0 is out of range; ...``; the CLI and the server put their own name first."""
        return f"{self.key}={self.value} {self.reason}"


def max_beam(tgt_vocab_size: int) -> int:
    """The largest beam a target vocabulary allows: each step ranks 2 * beam candidates among the ids
    that can follow a prefix (all but PAD and BOS), so beam <= (V - 2) / 2; greedy (beam 1) always works."""
    return max(1, (tgt_vocab_size - 2) // 2)


def beam_problem(
    beam: int, nbest: int = 1, *, tgt_vocab_size: int | None = None, limit: int | None = None, sample: bool = False
) -> Problem | None:
    """1 <= beam, at most ``limit`` (a caller's own cap, e.g. a server's --max-beam) and at most what the
    target vocabulary allows (:func:`max_beam`, when ``tgt_vocab_size`` is known); then 1 <= nbest <= beam.
    With ``sample`` (sampling instead of search) the beam must be 1 and ``nbest``, the independent samples, 1 or more.
    """
    if sample:
        if beam != 1:
            return Problem(
                "beam", beam, "does not apply to sampling, which draws every token; leave it out (nbest: the samples)"
            )
        if nbest < 1:
            return Problem("nbest", nbest, "is out of range; use 1 or more (the independent samples per input)")
        return None
    vocab_cap = None if tgt_vocab_size is None else max_beam(tgt_vocab_size)
    if beam < 1 or (limit is not None and beam > limit):
        caps = [cap for cap in (limit, vocab_cap) if cap is not None]
        return Problem(
            "beam",
            beam,
            f"is out of range; use 1 (greedy) to {min(caps)}" if caps else "is out of range; use 1 (greedy) or more",
        )
    if vocab_cap is not None and beam > vocab_cap:
        return Problem(
            "beam",
            beam,
            f"needs a target vocabulary of at least {2 * beam + 2} ids, the model has {tgt_vocab_size}; "
            f"use a beam of at most {vocab_cap}",
        )
    if not 1 <= nbest <= beam:
        return Problem("nbest", nbest, f"is out of range; use 1 to the beam size ({beam}): 1 <= nbest <= beam")
    return None


MAX_LENPEN = 10.0  # |alpha| beyond this only makes ((5 + len) / 6) ** alpha overflow or vanish; 0.6 to 1.5 is usual


def lenpen_problem(lenpen: float) -> Problem | None:
    """The length penalty's alpha must be a finite number (NaN would make every score NaN) of at most
    :data:`MAX_LENPEN` either way: a larger one makes every penalty of a long output infinite (or zero),
    so that all hypotheses score alike and the search only reports noise."""
    if not math.isfinite(lenpen):
        return Problem("lenpen", lenpen, "must be a finite number; the usual range is 0.6 to 1.5")
    if abs(lenpen) > MAX_LENPEN:
        return Problem(
            "lenpen", lenpen, f"is out of range; use -{MAX_LENPEN:g} to {MAX_LENPEN:g} (the usual range is 0.6 to 1.5)"
        )
    return None


MAX_SEED = (
    1 << 32
) - 1  # CTranslate2's set_random_seed takes an unsigned 32-bit seed; tmt's own search keeps the same range


def sampling_problem(*, temperature: float, top_k: int, top_p: float, epsilon: float, seed: int) -> Problem | None:
    """The settings of sampling (``decode.sample``): a temperature above 0 (the logits are divided by it), top_k 0 (no
    cut) or more, top_p in (0, 1] (1: no cut), epsilon in [0, 1) (0: no cut) and a seed of 0 to :data:`MAX_SEED`.
    NaN fails every comparison, so it is refused too."""
    if not (math.isfinite(temperature) and temperature > 0):
        return Problem("temperature", temperature, "must be a number above 0; 1 samples the model's own distribution")
    if top_k < 0:
        return Problem("top_k", _short(top_k), "must be 0 (no cut) or more: sample among the k most probable tokens")
    if not 0 < top_p <= 1:
        return Problem("top_p", top_p, "is outside (0, 1]; use 1 (no cut) or e.g. 0.9 (the nucleus of 90%)")
    if not 0 <= epsilon < 1:
        return Problem("epsilon", epsilon, "is outside [0, 1); use 0 (no cut) or e.g. 0.0003 (Hewitt et al., 2022)")
    if not 0 <= seed <= MAX_SEED:
        return Problem("seed", _short(seed), f"is out of range; use 0 to {MAX_SEED}")
    return None


def _short(value: int) -> str | int:
    """An integer as a message shows it: at most 20 digits (a pasted number of thousands is not echoed)."""
    text = str(value) if value.bit_length() < 10_000 else "<a huge integer>"
    return value if len(text) <= 20 else text[:17] + "..."


def length_problem(max_len_a: float, max_len_b: int) -> Problem | None:
    """The longest output, floor(max_len_a * source length + max_len_b), grows with the source: neither
    setting may be negative."""
    for key, value in (("max_len_a", max_len_a), ("max_len_b", max_len_b)):
        if value < 0:
            return Problem(
                key, value, "must be 0 or positive (the longest output is max_len_a * source length + max_len_b)"
            )
    return None


def specials_problem(cfg: ModelConfig, vocab_size: int | None = None) -> Problem | None:
    """The special ids (``model.pad_id`` ... ``model.decoder_start_id``): within the vocabulary (when its size is
    known; -1 allowed for bos and the start, meaning none and bos), a start id when there is no BOS, pad, unk and
    eos distinct, and the start not EOS (a decoder starting from EOS would read its first input as the end)."""
    named = {
        "pad_id": cfg.pad_id,
        "unk_id": cfg.unk_id,
        "eos_id": cfg.eos_id,
        "bos_id": cfg.bos_id,
        "decoder_start_id": cfg.decoder_start_id,
    }
    for key, value in named.items():
        lowest = -1 if key in ("bos_id", "decoder_start_id") else 0
        if value < lowest:
            return Problem(
                f"model.{key}",
                value,
                "is out of range; give the id of the piece in the vocabulary" + (" or -1 (none)" if lowest else ""),
            )
        if vocab_size is not None and value >= vocab_size:
            return Problem(
                f"model.{key}",
                value,
                f"is outside the vocabulary of {vocab_size} pieces; give an id below {vocab_size}",
            )
    if cfg.start_id == -1:
        return Problem(
            "model.decoder_start_id",
            -1,
            "means model.bos_id, which is -1 (no BOS); give the id the decoder starts from",
        )
    for a, b in (("pad_id", "eos_id"), ("pad_id", "unk_id"), ("unk_id", "eos_id")):
        if named[a] == named[b]:
            return Problem(f"model.{a}", named[a], f"is also model.{b}; the two ids must differ")
    if cfg.start_id == cfg.eos_id and not cfg.decoder_languages:  # M2M100 / NLLB start from EOS, then a language
        return Problem(
            "model.decoder_start_id",
            cfg.start_id,
            "is model.eos_id; the decoder must not start from the end of sentence",
        )
    return None
