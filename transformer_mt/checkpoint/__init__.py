"""Checkpoint files: atomic save, safe load, retention and averaging."""
