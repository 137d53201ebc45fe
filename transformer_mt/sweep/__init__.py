"""`tmt sweep`: the paper's Table 3 at any scale. A base config, a list of variations (one change each),
the same training budget for every variant, and the table of what each change bought.

- ``variations``: the rows (Table 3's scaled to the base, or a YAML list), their names and selection;
- ``runner``: one `tmt train` run per row, markers that let a sweep run again continue where it stopped;
- ``report``: the table (markdown, JSON) and a bar chart of each row's BLEU.
"""

from transformer_mt.sweep.report import COLUMNS, columns, markdown, plot_bleu, write_outputs
from transformer_mt.sweep.runner import SweepReport, budget_overrides, read_result, run_sweep, trained_parameters
from transformer_mt.sweep.variations import (
    SweepError,
    Variation,
    check_variations,
    load_variations,
    select,
    table3_variations,
    variations_yaml,
)

__all__ = [
    "COLUMNS",
    "SweepError",
    "SweepReport",
    "Variation",
    "budget_overrides",
    "check_variations",
    "columns",
    "load_variations",
    "markdown",
    "plot_bleu",
    "read_result",
    "run_sweep",
    "select",
    "table3_variations",
    "trained_parameters",
    "variations_yaml",
    "write_outputs",
]
