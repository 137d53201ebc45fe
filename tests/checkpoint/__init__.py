"""Tests of transformer_mt.checkpoint."""
