"""What a model computes on one sentence or batch, as tensors and plain data: the attention maps of a sentence
(``attention``), the tensor shapes through the real modules (``shapes``) and the position vectors (``positions``).

`tmt attention` and `tmt inspect` draw and print them (``viz``), `tmt explore` serves them as JSON (``explore``);
both call this code, so the page and the commands show the same numbers. Core: no matplotlib, no fastapi.
"""

from transformer_mt.analysis.attention import AnalysisError, AttentionMaps, batch_attention, sentence_maps
from transformer_mt.analysis.positions import position_table
from transformer_mt.analysis.shapes import describe, traced

__all__ = [
    "AnalysisError",
    "AttentionMaps",
    "batch_attention",
    "describe",
    "position_table",
    "sentence_maps",
    "traced",
]
