"""Hugging Face MarianMT / OPUS-MT models in and out: ``tmt import --from marian-hf`` and
``tmt export --format marian-hf``.

A leaf of the package: the core never imports it. ``safetensors`` (reading and writing weights) and
``transformers`` (only the tests and ``scripts/hf_compare.py`` run MarianMT itself) are imported inside the
functions that need them, so tmt works without them and the command names the extra to install.

- :mod:`~transformer_mt.hf.marian_config`: ``config.json`` <-> the ``model`` section, and what is refused;
- :mod:`~transformer_mt.hf.weights`: tensor names both ways, reading the weight files;
- :mod:`~transformer_mt.hf.vocab`: ``vocab.json`` / ``target_vocab.json`` and the tokenizer files;
- :mod:`~transformer_mt.hf.importer`: a MarianMT directory -> a tmt checkpoint;
- :mod:`~transformer_mt.hf.exporter`: a tmt checkpoint -> a MarianMT directory.
"""

from __future__ import annotations

import os
from pathlib import Path
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


def import_marian(directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """A MarianMT directory as a tmt checkpoint (:func:`transformer_mt.hf.importer.import_marian`)."""
    from transformer_mt.hf.importer import import_marian as run

    return run(directory, output, force=force)


def export_marian(checkpoint: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
    """A tmt checkpoint as a MarianMT directory (:func:`transformer_mt.hf.exporter.export_marian`)."""
    from transformer_mt.hf.exporter import export_marian as run

    return run(checkpoint, output, force=force)


__all__ = [
    "INSTALL_HINT",
    "HfError",
    "brief",
    "export_marian",
    "import_marian",
    "require_safetensors",
    "require_transformers",
]
