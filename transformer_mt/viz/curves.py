"""Training curves from metrics.jsonl: train loss, validation loss and BLEU against updates and wall-clock.

A run directory's ``metrics.jsonl`` holds one JSON record per line. Records carry ``"kind"``:
``train`` (``loss`` over the last ``log_every`` updates), ``valid`` (``val_loss``, ``val_bleu``, ...)
or ``summary`` (end of training); every record has ``update`` and ``wall`` (seconds of training,
counted across resumes). Files written before ``kind`` existed are read too: a record with ``val_loss``
is a validation, one with ``loss`` a training record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_mt.viz.figures import VizError, new_figure, save_figure


@dataclass
class RunCurves:
    """The records of one run, split by kind, in file order."""

    name: str  # legend label
    path: Path  # the metrics.jsonl read
    train: list[dict] = field(default_factory=list)
    valid: list[dict] = field(default_factory=list)


def _kind(rec: dict) -> str:
    if "kind" in rec:
        return str(rec["kind"])
    return "valid" if "val_loss" in rec else "train" if "loss" in rec else "other"


def read_run(path: str | Path, *, name: str | None = None) -> RunCurves:
    """Read a run directory (or its metrics.jsonl); VizError naming the file and line on a bad record."""
    path = Path(path)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.is_file():
        what = "has no metrics.jsonl" if path.is_dir() else "not found"
        raise VizError(f"{path}: {what}; give a run directory written by `tmt train` (train.out_dir)")
    run = RunCurves(name=name or (path.name if path.is_dir() else path.parent.name), path=file)
    with open(file, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if not line.endswith("\n"):  # the last line of a run still being written, or killed mid-write
                    break
                raise VizError(f"{file}:{lineno}: not a JSON record; the file is damaged (remove that line)") from None
            if not isinstance(rec, dict) or "update" not in rec:
                raise VizError(f"{file}:{lineno}: a record without 'update'; is this a tmt metrics.jsonl?")
            kind = _kind(rec)
            if kind == "train" and "loss" in rec:
                run.train.append(rec)
            elif kind == "valid":
                run.valid.append(rec)
    return run


def _labels(paths: list[Path]) -> list[str]:
    """Each run's directory name; parent/name where two runs share a name."""
    names = [p.resolve().name if p.is_dir() else p.resolve().parent.name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{(p if p.is_dir() else p.parent).resolve().parent.name}/{n}" for p, n in zip(paths, names)]


PANELS = (
    ("train", "loss", "train loss (label-smoothed, per token)"),
    ("valid", "val_loss", "validation loss (label-smoothed)"),
    ("valid", "val_bleu", "validation BLEU"),
)


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, *, dpi: int = 90) -> Path:
    """One PNG (or SVG, by suffix): a 2 x 3 grid, columns = train loss, val loss, val BLEU; rows = against
    updates and against wall-clock minutes; one colour per run, legend with the run names."""
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise VizError("give at least one run directory")
    runs = [read_run(p, name=n) for p, n in zip(paths, _labels(paths))]
    if not any(r.train or r.valid for r in runs):
        raise VizError(f"{runs[0].path}: no training or validation records yet; plot after the first log_every updates")
    fig = new_figure(13, 6.5)
    axes = fig.subplots(2, 3)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    for col, (kind, key, title) in enumerate(PANELS):
        for row, (xkey, xlabel, scale) in enumerate(
            (("update", "updates", 1.0), ("wall", "wall-clock minutes", 1 / 60))
        ):
            ax = axes[row, col]
            drawn = False
            for run, colour in zip(runs, colours):
                recs = [r for r in (run.train if kind == "train" else run.valid) if key in r and xkey in r]
                if recs:
                    marker = "o" if kind == "valid" and len(recs) < 30 else None
                    ax.plot(
                        [r[xkey] * scale for r in recs],
                        [r[key] for r in recs],
                        color=colour,
                        marker=marker,
                        markersize=3,
                        linewidth=1.2,
                        label=run.name,
                    )
                    drawn = True
            if not drawn:
                ax.text(0.5, 0.5, f"no {key} records", ha="center", va="center", transform=ax.transAxes, color="0.5")
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.set_title(title, fontsize=10)
    by_label: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(label, handle)
    if by_label:
        fig.legend(
            list(by_label.values()), list(by_label), loc="outside lower center", ncols=min(len(by_label), 4), fontsize=9
        )
    return save_figure(fig, out, dpi=dpi)
