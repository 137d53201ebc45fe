"""transformer_mt: train and run Transformer machine-translation models."""

__version__ = "0.1.0"
