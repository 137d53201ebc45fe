"""Tests of transformer_mt.evaluation."""
