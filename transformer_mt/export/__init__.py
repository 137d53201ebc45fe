"""Converters from a tmt checkpoint to inference engines (CTranslate2 first), and decoding through them.

- ``export``: ``tmt export``, a checkpoint as a CTranslate2 model directory (``ctranslate2``);
- ``ctranslate2_translator``: ``--engine ctranslate2`` of `tmt translate`, `tmt evaluate` and `tmt serve`, a
  translator with ``Translator``'s interface (``engine``) over a conversion cached beside the checkpoint (``cache``).

A leaf of the package: the core never imports it, and each engine's library is imported only by
that engine's module, so tmt works without it and the command that needs it names the extra to install.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.errors import TmtError

if TYPE_CHECKING:
    from transformer_mt.export.engine import CTranslate2Translator

FORMATS = ("ctranslate2",)


class ExportError(TmtError, ValueError):
    """An export that cannot be done, worded for the user (one line: what and the fix)."""


def export(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    format: str = "ctranslate2",
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Convert ``checkpoint`` into an inference-engine model directory ``out_dir``; returns ``out_dir``."""
    if format not in FORMATS:
        raise ExportError(f"--format {format!r} is not supported; choose one of: {', '.join(FORMATS)}")
    from transformer_mt.export.ctranslate2 import export_ctranslate2

    return export_ctranslate2(checkpoint, out_dir, quantization=quantization, force=force)


def ctranslate2_translator(
    checkpoints: Sequence[str | os.PathLike],
    *,
    device: str = "auto",
    dtype: str = "float32",
    threads: int = 0,
    weights: str | None = None,
    compute_type: str = "float32",
) -> CTranslate2Translator:
    """``--engine ctranslate2``: the checkpoint converted once (cached beside it) and decoded by CTranslate2, behind
    ``Translator``'s interface; ``compute_type`` is CTranslate2's (float32, int8, int8_float32, ...)."""
    from transformer_mt.export.engine import CTranslate2Translator

    return CTranslate2Translator.from_checkpoints(
        checkpoints, device=device, dtype=dtype, threads=threads, weights=weights, compute_type=compute_type
    )
