"""`tmt sweep`: the paper's Table 3 variations of a config, trained and tabulated."""

from transformer_mt.sweep.sweep import SweepError, Variation, budget_overrides, columns, load_variations, run_sweep, select, table3_variations, variations_yaml

__all__ = ["SweepError", "Variation", "budget_overrides", "columns", "load_variations", "run_sweep", "select", "table3_variations", "variations_yaml"]
