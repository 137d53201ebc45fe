"""Converters from a tmt checkpoint to inference engines (CTranslate2 first), and decoding through them.

- ``CTranslate2Exporter`` and ``export``: `tmt export --format ctranslate2`, a checkpoint as a CTranslate2 model
  directory (``ctranslate2``);
- ``ctranslate2_translator``: ``--engine ctranslate2`` of `tmt translate`, `tmt evaluate` and `tmt serve`, a
  translator with ``Translator``'s interface (``engine``) over a conversion cached beside the checkpoint (``cache``);
- ``ExportError``: what every module here raises for a mistake the user can fix (``errors``).

A leaf of the package: the core never imports it, and each engine's library is imported only inside the functions
of that engine's module, so tmt works without it and the command that needs it names the extra to install.
"""

from transformer_mt.export.ctranslate2 import CTranslate2Exporter
from transformer_mt.export.ctranslate2 import export_ctranslate2 as export
from transformer_mt.export.engine import CTranslate2Translator, ctranslate2_translator
from transformer_mt.export.errors import ExportError

__all__ = ["CTranslate2Exporter", "CTranslate2Translator", "ExportError", "ctranslate2_translator", "export"]
