"""Typed configuration: one dataclass per concern, loaded from YAML and validated.

A YAML file has up to five top-level sections, ``data``, ``tokenizer``, ``model``, ``train`` and
``decode``; every field has a default, so a file states only what it changes. Unknown keys, wrong
types and impossible values raise :class:`ConfigError` with one line that names the file, the key
and what to change. Dotted overrides (``model.encoder_layers=3``) go through the same checks.

- ``sections``: the dataclasses and their defaults;
- ``loading``: strict YAML, typed values, overrides, to and from plain dicts;
- ``checks``: :func:`validate`, each section's checks and the allocation bounds (:data:`MAX_PARAMETERS`,
  :func:`model_elements`, :func:`size_problem`); :func:`quote` and :func:`quote_name`, how a message shows a
  value or a name from a file;
- ``corpora``: the checks of the training corpora and validation sets (:func:`validation_sets`), and the names
  they go by (:func:`corpus_name`, :func:`valid_set_name`);
- ``rules``: the search settings' rules (beam, n-best, length penalty, output length) that the
  config, the command line, the server and the search each check with the same functions.
"""

from transformer_mt.config.checks import (
    CHOICES,
    LIMITS,
    MAX_PARAMETERS,
    MAX_POSITION_TABLE_BYTES,
    PATH_KEYS,
    ConfigError,
    model_elements,
    quote,
    quote_name,
    size_problem,
    validate,
)
from transformer_mt.config.corpora import corpus_name, model_language, valid_set_name, validation_sets
from transformer_mt.config.loading import from_dict, load_config, save_config, stated_keys, to_dict
from transformer_mt.config.rules import (
    MAX_SEED,
    Problem,
    beam_problem,
    length_problem,
    lenpen_problem,
    max_beam,
    sampling_problem,
    specials_problem,
)
from transformer_mt.config.sections import (
    LORA_TARGETS,
    Config,
    CorpusConfig,
    DataConfig,
    DecodeConfig,
    FiltersConfig,
    FreezeConfig,
    LoraConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
    ValidSetConfig,
)

__all__ = [
    "CHOICES",
    "LIMITS",
    "MAX_PARAMETERS",
    "MAX_SEED",
    "MAX_POSITION_TABLE_BYTES",
    "PATH_KEYS",
    "Config",
    "ConfigError",
    "CorpusConfig",
    "DataConfig",
    "DecodeConfig",
    "FiltersConfig",
    "FreezeConfig",
    "LORA_TARGETS",
    "LoraConfig",
    "ModelConfig",
    "Problem",
    "TokenizerConfig",
    "TrainConfig",
    "ValidSetConfig",
    "beam_problem",
    "corpus_name",
    "from_dict",
    "length_problem",
    "lenpen_problem",
    "sampling_problem",
    "load_config",
    "max_beam",
    "model_language",
    "model_elements",
    "quote",
    "quote_name",
    "size_problem",
    "specials_problem",
    "stated_keys",
    "save_config",
    "to_dict",
    "valid_set_name",
    "validate",
    "validation_sets",
]
