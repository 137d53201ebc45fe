"""Fixtures shared by the data tests."""

from __future__ import annotations

import pytest

from transformer_mt.text import Tokenizer


@pytest.fixture(scope="module")
def tok(spm_model) -> Tokenizer:
    """The session's small sentencepiece model (trained on the Multi30k slice), loaded once per module."""
    return Tokenizer(spm_model)
