"""Tests of transformer_mt.sweep."""
