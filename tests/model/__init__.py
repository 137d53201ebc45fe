"""Tests of transformer_mt.model."""
