"""Hugging Face MarianMT / OPUS-MT models in and out: ``tmt import --from marian-hf`` and
``tmt export --format marian-hf``.

A leaf of the package: the core never imports it. ``safetensors`` (reading and writing weights) and
``transformers`` (only the tests and ``scripts/hf_compare.py`` run MarianMT itself) are imported inside the
functions that need them, so tmt works without them and the command names the extra to install.

- :mod:`~transformer_mt.hf.errors`: ``HfError``, and the optional libraries imported on demand;
- :mod:`~transformer_mt.hf.marian_config`: ``config.json`` <-> the ``model`` section, and what is refused;
- :mod:`~transformer_mt.hf.weights`: tensor names both ways, reading the weight files;
- :mod:`~transformer_mt.hf.vocab`: ``vocab.json`` / ``target_vocab.json`` and the tokenizer files;
- :mod:`~transformer_mt.hf.importer`: a MarianMT directory -> a tmt checkpoint (``MarianImporter``);
- :mod:`~transformer_mt.hf.exporter`: a tmt checkpoint -> a MarianMT directory (``MarianExporter``);
- :mod:`~transformer_mt.hf.m2m100_config`, :mod:`~transformer_mt.hf.m2m100_importer`,
  :mod:`~transformer_mt.hf.m2m100_exporter`: M2M100 / NLLB both ways (``tmt import --from m2m100-hf``,
  ``tmt export --format m2m100-hf``; ``M2M100Importer``, ``M2M100Exporter``).
"""

from transformer_mt.hf.errors import INSTALL_HINT, HfError, brief, require_safetensors, require_transformers
from transformer_mt.hf.exporter import MarianExporter, export_marian
from transformer_mt.hf.importer import MarianImporter, import_marian
from transformer_mt.hf.m2m100_exporter import M2M100Exporter, export_m2m100
from transformer_mt.hf.m2m100_importer import M2M100Importer, import_m2m100

__all__ = [
    "INSTALL_HINT",
    "HfError",
    "M2M100Exporter",
    "M2M100Importer",
    "MarianExporter",
    "MarianImporter",
    "brief",
    "export_m2m100",
    "export_marian",
    "import_m2m100",
    "import_marian",
    "require_safetensors",
    "require_transformers",
]
