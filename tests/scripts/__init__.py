"""Tests of the scripts in scripts/ (benchmark, recipe, published BLEU, Table 3 comparison)."""
