"""Tests of transformer_mt.viz."""
