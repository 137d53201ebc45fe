"""Every format `tmt export` writes and `tmt import` reads, in one registry: the commands' defaults, their `--help`
and the error for an unknown format all read :data:`EXPORT_FORMATS` and :data:`IMPORT_FORMATS`.

Each format is one converter class in the leaf that knows it (an :class:`~transformer_mt.checkpoint.Exporter` or
:class:`~transformer_mt.checkpoint.Importer`, whose one method ``convert`` does the work), named here as
``"module:Class"`` and imported only when a command asks for that format: `tmt --help` stays instant, and a
missing extra (ctranslate2, transformers, safetensors) only stops the format that needs it. The registry lives in
the command line, the one layer that may import both leaves (``export`` and ``hf`` are independent of each other).

A new format is one module in its leaf, with its converter class, and one line below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformer_mt.errors import TmtError

if TYPE_CHECKING:
    from transformer_mt.checkpoint import Exporter, Importer


@dataclass(frozen=True)
class Format:
    """One format of one direction."""

    name: str  # the value of --format (export) or --from (import)
    label: str  # what it is, in a few words, for --help
    converter: str  # "module:Class" of its converter, imported when a command uses it


EXPORT_FORMATS: tuple[Format, ...] = (  # the first is `tmt export`'s default
    Format("ctranslate2", "CTranslate2", "transformer_mt.export.ctranslate2:CTranslate2Exporter"),
    Format("marian-hf", "Hugging Face MarianMT, transformers", "transformer_mt.hf.exporter:MarianExporter"),
    Format("m2m100-hf", "Hugging Face M2M100 / NLLB, transformers", "transformer_mt.hf.m2m100_exporter:M2M100Exporter"),
)
IMPORT_FORMATS: tuple[Format, ...] = (
    Format("marian-hf", "Hugging Face MarianMT / OPUS-MT", "transformer_mt.hf.importer:MarianImporter"),
    Format("m2m100-hf", "Hugging Face M2M100 / NLLB", "transformer_mt.hf.m2m100_importer:M2M100Importer"),
)


class FormatError(TmtError, ValueError):
    """A format tmt does not know, worded for the user with every format it knows."""


def choices(formats: tuple[Format, ...]) -> str:
    """The formats for `--help`: ``a (A)``, ``a (A) or b (B)``, ``a (A), b (B) or c (C)``."""
    named = [f"{f.name} ({f.label})" for f in formats]
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} or {named[-1]}"


def exporter(name: str) -> Exporter:
    """The converter of `tmt export --format NAME`, or a FormatError naming every export format."""
    converter = _converter(EXPORT_FORMATS, name, option="--format")
    from transformer_mt.checkpoint import Exporter  # torch, once a format is known: an unknown one is told at once

    if not isinstance(converter, Exporter):
        raise TypeError(f"{name}: the export registry names {type(converter).__name__}, not an Exporter")
    return converter


def importer(name: str) -> Importer:
    """The converter of `tmt import --from NAME`, or a FormatError naming every import format."""
    converter = _converter(IMPORT_FORMATS, name, option="--from")
    from transformer_mt.checkpoint import Importer  # torch, once a format is known: an unknown one is told at once

    if not isinstance(converter, Importer):
        raise TypeError(f"{name}: the import registry names {type(converter).__name__}, not an Importer")
    return converter


def _converter(formats: tuple[Format, ...], name: str, *, option: str) -> object:
    """An instance of the converter ``formats`` registers as ``name``; its module is imported only now."""
    found = next((f for f in formats if f.name == name), None)
    if found is None:
        from transformer_mt.config import quote

        known = ", ".join(f.name for f in formats)
        raise FormatError(f"{option} {quote(name)} is not supported; choose one of: {known}")
    module, _, cls = found.converter.partition(":")
    return getattr(importlib.import_module(module), cls)()
