"""Scores: sacreBLEU metrics, validation during training and `tmt evaluate`."""

from transformer_mt.evaluation.evaluate import (
    BleuSet,
    ValidationError,
    bleu_set,
    checked_validation_set,
    evaluate_file,
    validation_bleu,
    validation_loss,
)
from transformer_mt.evaluation.metrics import MetricsError, format_json, format_text, read_lines, score, score_files

__all__ = [
    "BleuSet",
    "MetricsError",
    "ValidationError",
    "bleu_set",
    "checked_validation_set",
    "evaluate_file",
    "format_json",
    "format_text",
    "read_lines",
    "score",
    "score_files",
    "validation_bleu",
    "validation_loss",
]
