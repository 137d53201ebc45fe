"""Figures on the Agg canvas (no pyplot state, no display needed), and the error every picture or report raises.

matplotlib is optional (``pip install -e ".[viz]"``) and imported only through :func:`new_figure`, so the text
reports (``tmt inspect`` without ``--pe``) work without it.
"""

from __future__ import annotations

from pathlib import Path

from transformer_mt.errors import TmtError

INSTALL = 'pip install -e ".[viz]"'


class VizError(TmtError, ValueError):
    """A picture or report cannot be made (bad input, missing matplotlib); one line with the fix."""


def new_figure(width: float, height: float):
    """A matplotlib Figure (inches) on the Agg canvas; VizError naming the install command without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise VizError(f"drawing pictures needs matplotlib, which is not installed: {INSTALL}") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | Path, *, dpi: int = 90) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: .png, .svg, .pdf), creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
