"""transformer_mt: train and run Transformer machine-translation models.

The Python API::

    import transformer_mt

    translator = transformer_mt.load("runs/multi30k_en_de/checkpoint_best.pt")  # device="auto", dtype="float32"
    translator.translate(["A man is riding a bike."])  # one str per line, with the checkpoint's beam and lenpen
    translator.translate("A man.", beam=5, lenpen=1.0, nbest=3)  # one str in: its n-best [(score, text), ...]
    translator.translate(["A man."], tgt_lang="fr")  # a multilingual model: one of translator.languages

:func:`load` takes one checkpoint or a list of them (an ensemble) and returns a :class:`Translator`;
:meth:`Translator.translate` defaults to the checkpoint's ``decode`` settings (a multilingual model is asked for
one of its :attr:`Translator.languages` with ``tgt_lang``), and
:meth:`Translator.translate_batch` also returns the call's stats. Configs are :class:`Config`
(:func:`load_config` reads a YAML file), and every user mistake is a :class:`TmtError` worded in one
line. The command line (``tmt``) is :mod:`transformer_mt.cli`; the layers and what each package owns
are described in docs/architecture.md.

``load`` and ``Translator`` are imported on first use, so that ``import transformer_mt`` (and ``tmt
--help``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # before the imports: transformer_mt.cli.app reads it

from transformer_mt.config import Config, ConfigError, load_config
from transformer_mt.errors import TmtError

if TYPE_CHECKING:
    from transformer_mt.decoding import Translator, load

__all__ = ["Config", "ConfigError", "TmtError", "Translator", "__version__", "load", "load_config"]

_LAZY = {"load", "Translator"}  # from transformer_mt.decoding, which imports torch


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from transformer_mt import decoding

        value = getattr(decoding, name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'transformer_mt' has no attribute {name!r}")
