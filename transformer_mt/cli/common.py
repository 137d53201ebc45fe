"""Helpers shared by the command modules: input and output streams, decoding options."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

def open_in(path: Optional[Path]):
    if path is None or str(path) == "-":
        return sys.stdin
    if not path.is_file():
        raise FileNotFoundError(f"{path}: input file not found; check the path")
    return open(path, encoding="utf-8")

def open_out(path: Optional[Path]):
    if path is None or str(path) == "-":
        return sys.stdout
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")

def progress(handle, path: Optional[Path]):
    """A tqdm bar on stderr for files (by bytes would need binary reads; lines suffice)."""
    if path is None or str(path) == "-" or not sys.stderr.isatty():
        return handle
    from tqdm import tqdm

    return tqdm(handle, desc=f"{path.name}", unit=" lines", leave=False)

CKPT_HELP = ("A checkpoint written by `tmt train` or `tmt average`; repeat -c to decode an ensemble "
              "(mean of the models' probabilities; they must share the tokenizer).")
BEAM_HELP = "Beam size (1 = greedy). Default: the checkpoint's decode.beam."
LENPEN_HELP = "GNMT length penalty alpha, ((5+len)/6)^alpha. Default: decode.lenpen."

def decode_args(tr, beam: Optional[int], lenpen: Optional[float], nbest: int) -> tuple[int, float]:
    from transformer_mt.translate import TranslateError

    beam = tr.cfg.decode.beam if beam is None else beam
    lenpen = tr.cfg.decode.lenpen if lenpen is None else lenpen
    if beam < 1 or not 1 <= nbest <= beam:
        raise TranslateError(f"--beam {beam} --nbest {nbest}: need beam >= 1 and 1 <= nbest <= beam")
    return beam, lenpen

