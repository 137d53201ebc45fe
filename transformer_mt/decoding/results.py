"""What translating text gives back and what every engine of text shares, above the search, below the Translator.

- :class:`TextTranslator`: what `tmt evaluate`, `tmt serve` and ``translate_stream`` use of a translator (tmt's
  ``Translator``, or an engine built outside the core that translates the same way, such as the CTranslate2 one);
- :class:`TranslationResult` and :class:`TranslateStats`: what one ``translate_batch`` call returns;
  :data:`Translation`: what ``Translator.translate`` gives per line;
- :func:`checked_request`: the checks of a ``translate_batch`` call, shared by every engine, and
  :class:`TranslateError`, the translation problems worded for the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from transformer_mt.config import Config, length_problem
from transformer_mt.decoding.lengths import positions_needed
from transformer_mt.decoding.sampling import Sampling
from transformer_mt.decoding.steps import check_settings
from transformer_mt.errors import TmtError
from transformer_mt.text import Tokenizer


class TranslateError(TmtError, ValueError):
    """A translation problem worded for the user."""


@dataclass(frozen=True)
class TranslateStats:
    """Counts of one ``Translator.translate_batch`` call, or the sum of several (``a + b``), for the end-of-run
    report and the truncation warning."""

    lines: int = 0  # input lines, empty ones included
    truncated: int = 0  # lines cut to max_src_tokens
    tgt_tokens: int = 0  # generated tokens of the best hypotheses, + EOS each (fairseq's count)
    seconds: float = 0.0  # wall time inside translate_batch()
    max_src_tokens: int = 0  # the truncation limit the counts refer to

    def __add__(self, other: TranslateStats) -> TranslateStats:
        return TranslateStats(
            self.lines + other.lines,
            self.truncated + other.truncated,
            self.tgt_tokens + other.tgt_tokens,
            self.seconds + other.seconds,
            max(self.max_src_tokens, other.max_src_tokens),
        )

    def warning(self) -> str | None:
        """One line counting the truncated input lines, or None when there were none."""
        if not self.truncated:
            return None
        s = "s" if self.truncated > 1 else ""
        return (
            f"tmt translate: warning: {self.truncated} input line{s} longer than {self.max_src_tokens} tokens "
            f"(model.max_positions={self.max_src_tokens + 1}) truncated"
        )


class TranslationResult(NamedTuple):
    """What one ``Translator.translate_batch`` call returns; unpacks as ``hypotheses, stats``."""

    hypotheses: list[list[tuple[float, str]]]  # per input line, in input order: n-best (score, text), best first
    stats: TranslateStats  # this call's counts only


# Translator.translate's result per line: the text, or with nbest > 1 its n-best (score, text)
Translation = str | list[tuple[float, str]]


class TextTranslator(Protocol):
    """Text in, n-best translations out, by ``Translator``'s rules (one output per input line, an empty line gives
    an empty translation, a source over ``max_src_tokens`` pieces is truncated): what `tmt evaluate`, `tmt serve` and
    ``translate_stream`` call. ``Translator`` is one; the CTranslate2 engine (``transformer_mt.export``) another."""

    cfg: Config  # the checkpoint's config: its decode section gives the defaults and the batch size
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    max_src_tokens: int  # longer sources are truncated to this many pieces (EOS is one more)

    @property
    def num_parameters(self) -> int:
        """The model's parameters (an ensemble's: all members'), for reports."""
        ...

    def decode_defaults(self, beam: int | None = None, lenpen: float | None = None) -> tuple[int, float]:
        """``beam`` and ``lenpen``, each the checkpoint's ``decode`` setting when None."""
        ...

    def translate_batch(
        self,
        lines: list[str],
        *,
        beam: int,
        lenpen: float,
        nbest: int = 1,
        batch_tokens: int | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        max_output_tokens: int | None = None,
        scores: bool = True,
        sampling: Sampling | None = None,
    ) -> TranslationResult:
        """n-best (score, text) lists, one per input line, in input order, and this call's stats. ``scores=False``: the
        caller reads the text alone (one best, no score printed), and a translator that would spend time on the
        scores alone may skip them and give NaN. ``sampling``: ``nbest`` samples per line instead of a search (beam 1),
        the lines numbered from ``sampling.first_line`` for their seeds; an engine refuses what it cannot honour."""
        ...


def checked_request(
    translator: TextTranslator,
    *,
    beam: int,
    nbest: int,
    lenpen: float,
    max_len_a: float | None,
    max_len_b: int | None,
    max_output_tokens: int | None,
    positions: int,
    sample: bool = False,
) -> tuple[float, int]:
    """The checks of a ``translate_batch`` call, before anything is encoded (``--beam 100000`` must not allocate
    first), shared by every engine: beam, n-best and length penalty (SearchError, from ``check_settings``; with
    ``sample``, sampling's beam of 1 and any number of samples); the output length rule and the cap
    (TranslateError), within the ``positions`` the engine was loaded with. Returns the (max_len_a, max_len_b) in
    force."""
    check_settings(beam, nbest, lenpen=lenpen, outputs=translator.tgt_tok.vocab_size, sample=sample)
    d = translator.cfg.decode
    a, b = d.max_len_a if max_len_a is None else max_len_a, d.max_len_b if max_len_b is None else max_len_b
    problem = length_problem(a, b)
    if problem:
        raise TranslateError(str(problem))
    if max_output_tokens is not None and max_output_tokens < 1:
        raise TranslateError(f"max_output_tokens={max_output_tokens} must be at least 1 (None: no cap)")
    if positions_needed(translator.max_src_tokens + 1, max_len_a=a, max_len_b=b) > positions:
        raise TranslateError(
            f"max_len_a={a:g} max_len_b={b} allow outputs longer than the {positions} positions the model was loaded "
            f"with (decode.max_len_a={d.max_len_a:g}, decode.max_len_b={d.max_len_b}); lower them"
        )
    return a, b
