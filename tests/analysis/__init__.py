"""Tests of transformer_mt.analysis."""
