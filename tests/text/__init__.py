"""Tests of transformer_mt.text."""
