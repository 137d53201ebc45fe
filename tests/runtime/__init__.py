"""Tests of transformer_mt.runtime."""
