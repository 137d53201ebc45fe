"""What a sweep reports: Table 3's columns per row, the table as markdown and JSON, and a bar chart of BLEU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformer_mt.config import Config

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions")


def columns(cfg: Config) -> dict[str, Any]:
    """The varied columns of Table 3 for one config."""
    m = cfg.model
    return {
        "N": m.encoder_layers,
        "N_dec": m.decoder_layers,
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "h": m.heads,
        "d_k": m.head_dim or m.d_model // m.heads,
        "d_v": m.value_dim or m.d_model // m.heads,
        "P_drop": m.dropout,
        "eps_ls": cfg.train.label_smoothing,
        "positions": m.positions,
    }


def _cell(row: dict[str, Any], col: str) -> str:
    if col not in row:
        return ""
    if col == "N" and row.get("N_dec", row["N"]) != row["N"]:
        return f"{row['N']}/{row['N_dec']}"  # encoder/decoder
    return f"{row[col]:g}" if isinstance(row[col], float) else str(row[col])


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The paper's Table 3 layout: the base row in full, each variant only where it differs from the base."""
    base = next((r for r in rows if r["row"] == "base" and "d_model" in r), None)
    b, bl = meta["budget"], meta["bleu"]
    budget = " and ".join(
        x
        for x in (
            f"{b['updates']} updates" * bool(b["updates"]),
            f"{b['minutes']:g} minutes" * bool(b["minutes"]),
            f"{b['epochs']} epochs" * bool(b["epochs"]),
        )
        if x
    )
    search = "greedy" if bl["beam"] == 1 else f"beam {bl['beam']}, lenpen {bl['lenpen']:g}"
    sentences = {0: "all validation sentences", -1: "no sentences (BLEU off)"}.get(
        bl["sentences"], f"the first {bl['sentences']} validation sentences"
    )
    lines = [
        f"# Table 3 variations of `{meta['base_config']}`",
        "",
        f"Each row trained for the same budget ({budget}) from the base config"
        + (f" with `{' '.join('--set ' + o for o in meta['overrides'])}`" if meta["overrides"] else "")
        + ". "
        f"val BLEU: {bl['metric']} on {sentences}, {search}. "
        "val PPL: per-piece perplexity exp(NLL), no label smoothing, whole validation set. "
        "params: sum(p.numel()) of the trained model (tied matrices once). "
        "wall: training minutes, validation included. Blank cells equal the base row."
        + (f"\n\nCommand: `{meta['command']}`" if meta["command"] else ""),
        "",
        "| row | variant | " + " | ".join(COLUMNS) + " | updates | val PPL | val BLEU | params | wall (min) | status |",
        "|" + " --- |" * (len(COLUMNS) + 8),
    ]
    for r in rows:
        cells = [r["row"], r["name"]]
        cells += [_cell(r, c) if base is None or r is base or _cell(r, c) != _cell(base, c) else "" for c in COLUMNS]
        done = r["status"] == "done"
        cells += [
            str(r["updates"]) if done else "",
            f"{r['val_ppl']:.2f}" if done and r.get("val_ppl") is not None else "",
            f"{r['val_bleu']:.2f}" if done and r.get("val_bleu") is not None else "",
            f"{r['params']:,}" if done else "",
            f"{r['wall_s'] / 60:.1f}" if done else "",
            r["status"] + (f": {r['note']}" if r.get("note") else ""),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot_bleu(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path | None:
    """Horizontal bars of val BLEU per finished variant, coloured by row label, the base's BLEU as a dashed
    line, each bar labelled with its BLEU and parameters. None when no row has a BLEU yet."""
    from transformer_mt.viz import new_figure, save_figure  # matplotlib only here (VizError names the extra)

    done = [r for r in rows if r["status"] == "done" and r.get("val_bleu") is not None]
    if not done:
        return None
    labels = list(dict.fromkeys(r["row"] for r in done))
    fig = new_figure(7.5, 1.4 + 0.3 * len(done))
    ax = fig.add_subplot()
    ys = list(range(len(done)))
    ax.barh(ys, [r["val_bleu"] for r in done], color=[f"C{labels.index(r['row']) % 10}" for r in done])
    ax.set_yticks(ys, [r["name"] if r["name"].startswith(r["row"]) else f"{r['row']}: {r['name']}" for r in done])
    ax.invert_yaxis()
    for y, r in zip(ys, done):
        ax.text(r["val_bleu"], y, f" {r['val_bleu']:.2f}  ({r['params'] / 1e6:.2f}M)", va="center", fontsize=8)
    base = next((r for r in done if r["row"] == "base"), None)
    if base is not None:
        ax.axvline(base["val_bleu"], color="0.3", linestyle="--", linewidth=1, label=f"base {base['val_bleu']:.2f}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max(r["val_bleu"] for r in done) * 1.3 + 0.5)
    ax.set_xlabel("val BLEU (cased sacreBLEU)")
    ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


def write_outputs(
    out: Path, rows: list[dict[str, Any]], meta: dict[str, Any], *, unless_unchanged: bool = False
) -> tuple[list[Path], str]:
    """OUT/table3.json, table3.md and (with matplotlib) table3.png, each written atomically; returns the files and
    why there is no picture. ``unless_unchanged``: leave the files as they are when table3.json already says this."""
    from transformer_mt.viz import VizError

    files = [out / "table3.json", out / "table3.md"]
    table = {**meta, "rows": rows}
    if unless_unchanged and all(f.is_file() for f in files) and _read_json(files[0]) == json.loads(json.dumps(table)):
        drawn = out / "table3.png"
        return ([*files, drawn], "") if drawn.is_file() else (files, "the table is unchanged and has no picture")
    for path, text in zip(files, (json.dumps(table, indent=1) + "\n", markdown(rows, meta))):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    b = meta["budget"]
    budget = (
        f"{b['updates']} updates"
        if b["updates"]
        else f"{b['minutes']:g} min"
        if b["minutes"]
        else f"{b['epochs']} epochs"
    )
    title = f"{Path(meta['base_config']).name}: val BLEU after {budget}"
    tmp_png = out / f".table3.{os.getpid()}.tmp.png"  # the suffix names the format for matplotlib
    try:
        picture = plot_bleu(rows, tmp_png, title=title)
        if picture is None:
            return files, "no finished row with a BLEU yet"
        os.replace(tmp_png, out / "table3.png")
    except VizError as exc:  # no matplotlib: the table is written all the same
        return files, str(exc)
    finally:
        tmp_png.unlink(missing_ok=True)
    return [*files, out / "table3.png"], ""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
