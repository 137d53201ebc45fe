"""Hugging Face MarianMT / OPUS-MT models in and out: ``tmt import --from marian-hf`` and
``tmt export --format marian-hf``.

A leaf of the package: the core never imports it, and ``transformers`` / ``safetensors`` are imported
only inside the functions that need them (:func:`require_hf`), so tmt works without them and the
command names the extra to install.
"""

from __future__ import annotations

from types import ModuleType

from transformer_mt.errors import TmtError

INSTALL_HINT = 'transformers and safetensors are not installed; run: pip install -e ".[hf]"'


class HfError(TmtError, ValueError):
    """A conversion that cannot be done, worded for the user (one line: what and the fix)."""


def require_hf() -> tuple[ModuleType, ModuleType]:
    """The ``transformers`` and ``safetensors.torch`` modules, or an HfError naming the install command."""
    try:
        import safetensors.torch
        import transformers
    except ImportError:
        raise HfError(INSTALL_HINT) from None
    return transformers, safetensors.torch


__all__ = ["INSTALL_HINT", "HfError", "require_hf"]
