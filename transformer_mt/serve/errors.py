"""The server's error, and the check that names the extra it needs."""

from __future__ import annotations

from transformer_mt.errors import TmtError

INSTALL_HINT = 'fastapi, uvicorn or prometheus-client is not installed; run: pip install -e ".[serve]"'


class ServeError(TmtError, ValueError):
    """A server that cannot start as asked, worded for the user."""


def require_serving() -> None:
    """Raise ServeError naming the install command when fastapi, uvicorn or prometheus_client is missing."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ServeError(INSTALL_HINT) from None
