"""Helpers shared by the command modules: input and output streams, decoding options."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Iterator, Optional

from transformer_mt.text import iter_file, iter_stream, safe_output

__all__ = ["input_lines", "safe_output", "progress", "decode_args", "CKPT_HELP", "BEAM_HELP", "LENPEN_HELP", "WEIGHTS_HELP"]


def input_lines(path: Optional[Path]) -> Iterator[str]:
    """The lines of PATH, or of stdin for None or "-", read by textio's rules (bytes decoded as
    strict UTF-8 whatever the locale; errors name FILE:LINE or <stdin>:LINE). A missing file fails now."""
    if path is None or str(path) == "-":
        return iter_stream()
    return iter_file(path)


def progress(handle, path: Optional[Path]):
    """A tqdm bar on stderr for files (by bytes would need binary reads; lines suffice)."""
    if path is None or str(path) == "-" or not sys.stderr.isatty():
        return handle
    from tqdm import tqdm

    return tqdm(handle, desc=f"{path.name}", unit=" lines", leave=False)


CKPT_HELP = (
    "A checkpoint written by `tmt train` or `tmt average`; repeat -c to decode an ensemble (mean of the models' probabilities; they must share the tokenizer)."
)
BEAM_HELP = "Beam size (1 = greedy). Default: the checkpoint's decode.beam."
LENPEN_HELP = "GNMT length penalty alpha, ((5+len)/6)^alpha. Default: decode.lenpen."
WEIGHTS_HELP = (
    "ema or raw: the moving average of the weights (train.ema_decay; what validation chose on) or the trained ones. "
    "Default: ema when the checkpoint holds it, else raw."
)


def decode_args(tr, beam: Optional[int], lenpen: Optional[float], nbest: int) -> tuple[int, float]:
    """--beam / --lenpen (or the checkpoint's defaults), checked before any input is encoded: a beam too
    large for the target vocabulary is refused here, not after allocating beam x sentences of decoder state."""
    from transformer_mt.decoding import TranslateError, max_beam

    beam = tr.cfg.decode.beam if beam is None else beam
    lenpen = tr.cfg.decode.lenpen if lenpen is None else lenpen
    if beam < 1 or not 1 <= nbest <= beam:
        raise TranslateError(f"--beam {beam} --nbest {nbest}: need beam >= 1 and 1 <= nbest <= beam")
    vocab = tr.tgt_tok.vocab_size
    if beam > max_beam(vocab):
        raise TranslateError(
            f"--beam {beam}: the model's target vocabulary has {vocab} ids, enough for a beam of at most {max_beam(vocab)}; lower --beam (4 to 10 is usual)"
        )
    if not math.isfinite(lenpen):
        raise TranslateError(f"--lenpen {lenpen}: must be a finite number; the usual range is 0.6 to 1.5")
    return beam, lenpen
