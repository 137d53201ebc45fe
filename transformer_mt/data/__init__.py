"""Parallel corpora: reading, the encoded cache, token-budget batches and a run's data preparation."""
