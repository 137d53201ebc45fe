"""Tests of transformer_mt.export."""
