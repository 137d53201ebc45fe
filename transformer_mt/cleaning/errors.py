"""The one error type of cleaning."""

from __future__ import annotations

from transformer_mt.errors import TmtError


class CleaningError(TmtError, ValueError):
    """A cleaning mistake the user can fix (files of different lengths, a missing extra, an output that is an input):
    one line naming the file, line or key and the fix."""
