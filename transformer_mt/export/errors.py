"""The error of the export leaf, shared by every module of it (the conversion, its cache, the engine)."""

from __future__ import annotations

from transformer_mt.errors import TmtError


class ExportError(TmtError, ValueError):
    """An export that cannot be done, worded for the user (one line: what and the fix)."""
