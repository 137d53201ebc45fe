"""Tests of transformer_mt.benchmark and its entry point scripts/benchmark.py."""
