"""The explorer's error, and the line that names the extra it needs."""

from __future__ import annotations

from transformer_mt.errors import TmtError

INSTALL_HINT = 'tmt explore needs fastapi and uvicorn, which are not installed; run: pip install -e ".[serve]"'


class ExploreError(TmtError, ValueError):
    """A request or a start-up option the explorer cannot honour, worded for the user (one line, with the fix)."""
