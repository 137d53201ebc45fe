"""Tests of the scripts in scripts/: the recipe, published BLEU, Table 3 beside the paper, the MarianMT comparison,
the attention and serving benchmarks."""
