"""The error of the hf leaf and its optional libraries: ``safetensors`` and ``transformers`` are imported only through
:func:`require_safetensors` and :func:`require_transformers`, which name the extra to install when one is missing."""

from __future__ import annotations

from types import ModuleType

from transformer_mt.errors import TmtError

INSTALL_HINT = 'transformers and safetensors are not installed; run: pip install -e ".[hf]"'


class HfError(TmtError, ValueError):
    """A conversion that cannot be done, worded for the user (one line: what and the fix)."""


def brief(exc: BaseException, limit: int = 120) -> str:
    """What a library's exception says, for a one-line message: its first line, unprintable characters replaced,
    at most ``limit`` characters (a parser may repeat part of the file it read)."""
    text = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_safetensors() -> ModuleType:
    """The ``safetensors.torch`` module, or an HfError naming the install command."""
    try:
        import safetensors.torch
    except ImportError:
        raise HfError(INSTALL_HINT) from None
    return safetensors.torch


def require_transformers() -> ModuleType:
    """The ``transformers`` module, or an HfError naming the install command."""
    try:
        import transformers
    except ImportError:
        raise HfError(INSTALL_HINT) from None
    return transformers
