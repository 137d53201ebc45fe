"""The positional-encoding matrix as a picture (section 3.5; learned tables, Table 3 row E, too).

Three panels: the matrix itself (positions down, dimensions across), a few of its dimensions as curves
against position (sinusoids of geometrically falling frequency), and the dot products PE_i . PE_j of
every pair of positions (largest on the diagonal, falling off with |i - j| for sinusoids: the property
section 3.5 gives for the choice).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from transformer_mt.viz.figures import new_figure, save_figure


def drawn_dimensions(d: int, layout: str | None) -> list[tuple[int, float | None]]:
    """Five dimensions spread over the frequencies, each with its sine's period in positions (None without a
    sinusoid layout). Frequency k has period 2 pi 10000^(2k/d), from ~10 to ~600 positions; its sine sits at
    dimension 2k (interleaved) or k (halves: all sines first)."""
    fractions = (0.05, 0.15, 0.25, 0.35, 0.5)
    if layout == "halves":
        ks = sorted({min(round(d * f / 2), (d + 1) // 2 - 1) for f in fractions})
        dims = ks
    else:
        dims = sorted({min(2 * round(d * f / 2), d - 2) for f in fractions} - {-2})
        ks = [i // 2 for i in dims]
    return [(i, 2 * math.pi * 10000 ** (2 * k / d) if layout else None) for i, k in zip(dims, ks)]


def plot_positions(
    table: torch.Tensor,
    out: str | Path,
    *,
    layout: str | None = "interleaved",
    title: str = "sinusoidal positional encoding",
    dpi: int = 72,
) -> Path:
    """Draw ``table`` (L positions, D dims) to ``out`` (PNG or SVG by suffix). ``layout``: the sinusoid layout
    (``model.position_layout``) that names each drawn dimension's sine and period; None for learned positions."""
    length, d = table.shape
    fig = new_figure(14, 4.6)
    ax_mat, ax_dims, ax_sim = fig.subplots(1, 3, width_ratios=[1.5, 1.2, 1])
    im = ax_mat.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax_mat.set(xlabel="dimension i", ylabel="position", title=f"{title}: {length} positions x d_model {d}")
    fig.colorbar(im, ax=ax_mat, shrink=0.8)
    for i, period in drawn_dimensions(d, layout):
        label = f"dim {i} (sin, period {period:.0f})" if period else f"dim {i}"
        ax_dims.plot(range(length), table[:, i].numpy(), linewidth=1.2, label=label)
    ax_dims.set(xlabel="position", ylabel="value", title="a few dimensions against position")
    ax_dims.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2)
    ax_dims.grid(True, alpha=0.3)
    sim = table @ table.T  # (L, D) x (D, L) -> (L, L)
    im = ax_sim.imshow(sim.numpy(), cmap="viridis", interpolation="nearest")
    ax_sim.set(xlabel="position j", ylabel="position i", title="PE_i . PE_j")
    fig.colorbar(im, ax=ax_sim, shrink=0.8)
    return save_figure(fig, out, dpi=dpi)
