"""Tests of transformer_mt.decoding."""
