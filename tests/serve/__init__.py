"""Tests of transformer_mt.serve."""
