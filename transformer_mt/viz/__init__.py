"""Pictures and reports of a model and its training: attention maps (``attention``), training curves
(``curves``), the inspection tree (``inspect``), the positional-encoding matrix (``positions``), drawn on the
figures of ``figures``. A leaf: the core never imports it; what it draws is computed by
``transformer_mt.analysis``.

matplotlib is optional (``pip install -e ".[viz]"``) and imported only when a figure is made, so the text
reports (``tmt inspect`` without ``--pe``) work without it.
"""

from transformer_mt.viz.attention import draw_kind, parse_indices, read_line, write_maps
from transformer_mt.viz.curves import RunCurves, plot_runs, read_run
from transformer_mt.viz.figures import INSTALL, VizError, new_figure, save_figure
from transformer_mt.viz.inspect import inspect_report, load_model
from transformer_mt.viz.positions import drawn_dimensions, plot_positions

__all__ = [
    "INSTALL",
    "RunCurves",
    "VizError",
    "draw_kind",
    "drawn_dimensions",
    "inspect_report",
    "load_model",
    "new_figure",
    "parse_indices",
    "plot_positions",
    "plot_runs",
    "read_line",
    "read_run",
    "save_figure",
    "write_maps",
]
