"""Tests of transformer_mt.cli's own modules (the commands end to end are in tests/e2e)."""
