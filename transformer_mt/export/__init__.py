"""Converters from a tmt checkpoint to inference engines (CTranslate2 first).

A leaf of the package: the core never imports it, and each engine's library is imported only by
that engine's module, so tmt works without it and ``tmt export`` names the extra to install.
"""

from __future__ import annotations

import os
from pathlib import Path

from transformer_mt.errors import TmtError

FORMATS = ("ctranslate2",)


class ExportError(TmtError, ValueError):
    """An export that cannot be done, worded for the user (one line: what and the fix)."""


def export(
    checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, format: str = "ctranslate2", quantization: str | None = None, force: bool = False
) -> Path:
    """Convert ``checkpoint`` into an inference-engine model directory ``out_dir``; returns ``out_dir``."""
    if format not in FORMATS:
        raise ExportError(f"--format {format!r} is not supported; choose one of: {', '.join(FORMATS)}")
    from transformer_mt.export.ctranslate2 import export_ctranslate2

    return export_ctranslate2(checkpoint, out_dir, quantization=quantization, force=force)
