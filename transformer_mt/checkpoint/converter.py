"""The two kinds of converter between a tmt checkpoint and another toolkit's model, one small class per format (as
CTranslate2's ``converters/converter.py`` has one per framework): an :class:`Exporter` writes a checkpoint as a model
directory (`tmt export --format NAME`), an :class:`Importer` reads a model directory into a checkpoint (`tmt import
--from NAME`). Each has the one method that converts, ``convert``.

A format's converter lives in the leaf that knows the format (``export``, ``hf``), where its optional library is
imported when ``convert`` runs; the command line lists every converter by name in one registry
(``transformer_mt/cli/formats.py``), so a new format is one module in its leaf and one line there.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path


class Exporter(ABC):
    """A tmt checkpoint as another toolkit's model directory, written beside the output and renamed into place
    (:func:`~transformer_mt.checkpoint.exports.staged_directory`) with its ``tmt_export.json`` marker."""

    @abstractmethod
    def convert(
        self,
        checkpoint: str | os.PathLike,
        output: str | os.PathLike,
        *,
        quantization: str | None = None,
        force: bool = False,
    ) -> Path:
        """Write ``checkpoint`` as the model directory ``output``; returns it. ``quantization``: the weight type the
        format stores (None: float32), refused in one line by a format that has no choice; ``force``: replace an
        earlier export whose files are unchanged (:func:`~transformer_mt.checkpoint.exports.output_problem`)."""

    @abstractmethod
    def summary(self, output: Path, *, quantization: str | None) -> str:
        """The line `tmt export` prints once ``output`` is written: what it holds and how to use it."""


class Importer(ABC):
    """Another toolkit's model directory as a tmt checkpoint that every tmt command accepts."""

    @abstractmethod
    def convert(self, directory: str | os.PathLike, output: str | os.PathLike, *, force: bool = False) -> Path:
        """Write the model in ``directory`` as the checkpoint file ``output``; returns its path. An existing
        ``output`` is replaced only with ``force``."""
