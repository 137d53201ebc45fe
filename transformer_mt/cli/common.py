"""Helpers shared by the command modules: input and output streams, decoding options."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.config import beam_problem, lenpen_problem
from transformer_mt.errors import TmtError
from transformer_mt.text import iter_file, iter_stream, safe_output

if TYPE_CHECKING:
    from transformer_mt.decoding import TextTranslator

__all__ = [
    "input_lines",
    "safe_output",
    "progress",
    "decode_args",
    "build_translator",
    "CKPT_HELP",
    "BEAM_HELP",
    "LENPEN_HELP",
    "WEIGHTS_HELP",
    "TGT_LANG_HELP",
    "ENGINE_HELP",
    "COMPUTE_TYPE_HELP",
]
ENGINES = ("tmt", "ctranslate2")


def input_lines(path: Path | None) -> Iterator[str]:
    """The lines of PATH, or of stdin for None or "-", read by textio's rules (bytes decoded as
    strict UTF-8 whatever the locale; errors name FILE:LINE or <stdin>:LINE). A missing file fails now."""
    if path is None or str(path) == "-":
        return iter_stream()
    return iter_file(path)


def progress(handle, path: Path | None):
    """A tqdm bar on stderr for files (by bytes would need binary reads; lines suffice)."""
    if path is None or str(path) == "-" or not sys.stderr.isatty():
        return handle
    from tqdm import tqdm

    return tqdm(handle, desc=f"{path.name}", unit=" lines", leave=False)


CKPT_HELP = (
    "A checkpoint written by `tmt train` or `tmt average`; repeat -c to decode an ensemble "
    "(mean of the models' probabilities; they must share the tokenizer)."
)
BEAM_HELP = "Beam size (1 = greedy). Default: the checkpoint's decode.beam."
LENPEN_HELP = "GNMT length penalty alpha, ((5+len)/6)^alpha. Default: decode.lenpen."
WEIGHTS_HELP = (
    "ema or raw: the moving average of the weights (train.ema_decay; what validation chose on) or the trained ones. "
    "Default: ema when the checkpoint holds it, else raw."
)
TGT_LANG_HELP = (
    "The target language of a multilingual model (e.g. fr: every source starts with its tag <2fr>); required when "
    "the model has several, optional with one. tmt inspect lists a checkpoint's languages."
)
SRC_LANG_HELP = "The source's language, for an NLLB / M2M100 model, by its code (e.g. eng_Latn; M2M100: en)."


ENGINE_HELP = (
    "tmt (its own search) or ctranslate2: the checkpoint converted once (cached beside it as CHECKPOINT.ct2/) and "
    "decoded by CTranslate2, one call over all lines (extra export; docs/deploying.md says what is equal)."
)
COMPUTE_TYPE_HELP = (
    "With --engine ctranslate2: CTranslate2's compute type, float32 (default), int8, int8_float32, ... "
    "(weights quantized when loading)."
)


def build_translator(
    checkpoints: list[Path],
    *,
    engine: str,
    device: str,
    dtype: str,
    threads: int,
    weights: str | None,
    compute_type: str | None,
) -> TextTranslator:
    """The translator --engine asks for: tmt's Translator, or the CTranslate2 engine (whose conversion note, if any,
    goes to stderr as one line)."""
    if engine not in ENGINES:
        raise TmtError(f"--engine {engine}: choose tmt or ctranslate2")
    if engine == "tmt":
        from transformer_mt.decoding import Translator

        if compute_type is not None:
            raise TmtError(
                f"--compute-type {compute_type} applies to --engine ctranslate2; tmt's own search takes --dtype"
            )
        return Translator.from_checkpoints(checkpoints, device=device, dtype=dtype, threads=threads, weights=weights)
    from transformer_mt.export import ctranslate2_translator

    tr = ctranslate2_translator(
        checkpoints,
        device=device,
        dtype=dtype,
        threads=threads,
        weights=weights,
        compute_type=compute_type or "float32",
    )
    if tr.note:
        print(f"tmt: {tr.note}", file=sys.stderr)
    return tr


def decode_args(tr, beam: int | None, lenpen: float | None, nbest: int) -> tuple[int, float]:
    """--beam / --lenpen (or the checkpoint's defaults) and --nbest, checked before any input is encoded: a beam
    too large for the target vocabulary is refused here, not after allocating beam x sentences of decoder state."""
    from transformer_mt.decoding import TranslateError

    beam, lenpen = tr.decode_defaults(beam, lenpen)
    problem = beam_problem(beam, nbest, tgt_vocab_size=tr.tgt_tok.vocab_size) or lenpen_problem(lenpen)
    if problem:
        raise TranslateError(f"--{problem.key} {problem.value} {problem.reason}")
    return beam, lenpen
