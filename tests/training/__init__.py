"""Tests of transformer_mt.training."""
