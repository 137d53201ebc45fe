"""Cleaning parallel text: rules that drop pairs, each named for what it drops, and `tmt clean`'s file work.

- ``rules``: the rules that look at one pair alone (empty, identical, word counts, length ratio, non-letters) and
  the normalisation of the duplicate rule;
- ``duplicates``: pairs seen before, remembered by an 8-byte hash in a numpy table;
- ``scripts``: the script each language is written in, and the script rule;
- ``language_id``: language identification with py3langid (the optional extra ``langid``);
- ``pair_filter``: :class:`PairFilter`, the rules of ``data.filters`` in their order over a stream of chunks;
- ``files``: :func:`clean_files`, a pair of files into kept pairs, dropped pairs and a report, written atomically.
"""

from transformer_mt.cleaning.errors import CleaningError
from transformer_mt.cleaning.files import CHUNK_LINES, CleanOutputs, clean_files
from transformer_mt.cleaning.pair_filter import KEEP, ORDER, CleaningReport, PairFilter
from transformer_mt.cleaning.rules import RATIO_MIN_WORDS, nonletter_share, normalize_for_duplicates
from transformer_mt.cleaning.scripts import SCRIPT_MIN_SHARE, SCRIPTS, base_language, script_share, scripts_of

__all__ = [
    "CHUNK_LINES",
    "KEEP",
    "ORDER",
    "RATIO_MIN_WORDS",
    "SCRIPTS",
    "SCRIPT_MIN_SHARE",
    "CleanOutputs",
    "CleaningError",
    "CleaningReport",
    "PairFilter",
    "base_language",
    "clean_files",
    "nonletter_share",
    "normalize_for_duplicates",
    "script_share",
    "scripts_of",
]
