"""The rows of a sweep: each a Table 3 label, a unique name and the overrides that make it from the base.

Variations. A YAML list of rows ``{row: A, name: h1, set: [model.heads=1]}``: ``row`` is the Table 3
label (base, A-E, or any other), ``name`` names the variant and its run directory (unique), ``set`` holds
``--set``-style overrides applied to the base config. Without a file, :func:`table3_variations` scales
the paper's rows to the base model (at the paper's base they are exactly Table 3's): (A) heads 1, h/2, 2h
and 4h with d_k = d_v = d_model/h (the paper: 1, 4, 16, 32 against 8); (B) d_k alone at d_k/4 and d_k/2;
(C) N at N/3, 2N/3, 4N/3, d_model and d_ff halved and doubled; (D) dropout and label smoothing at 0 and
higher; (E) learned positions instead of sinusoids. ``tmt sweep --print-variations`` writes that list.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from transformer_mt.config import Config
from transformer_mt.errors import TmtError

RESERVED = ("tokenizer", "cache")  # SWEEP_DIR entries that are not rows
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


class SweepError(TmtError, ValueError):
    """A sweep that cannot run as asked: one line naming the file, row or option and the fix."""


@dataclass
class Variation:
    """One row of the table: a label, a unique name and the overrides that make it from the base."""

    row: str  # Table 3 label: base, A, B, C, D, E (or any)
    name: str  # the variant and its run directory, SWEEP_DIR/<name>
    overrides: list[str] = field(default_factory=list)  # section.key=value, as `tmt train --set`


def _num(x: float) -> str:
    return f"{x:g}"


def table3_variations(cfg: Config) -> list[Variation]:
    """Table 3's rows A-E scaled to `cfg`'s model (see the module docstring); at the paper's base
    (N 6, d_model 512, d_ff 2048, h 8, d_k 64, P_drop 0.1, eps_ls 0.1) these are the paper's values."""
    m, t = cfg.model, cfg.train
    d, h = m.d_model, m.heads
    dk = m.head_dim or d // h
    out = [Variation("base", "base", [])]
    heads = [x for x in dict.fromkeys((1, h // 2, 2 * h, 4 * h)) if x >= 1 and x != h]
    reset = ["model.head_dim=0", "model.value_dim=0"] if m.head_dim or m.value_dim else []
    out += [Variation("A", f"A-h{x}", [f"model.heads={x}", *reset]) for x in sorted(heads)]
    out += [
        Variation("B", f"B-dk{x}", [f"model.head_dim={x}", f"model.value_dim={m.value_dim or d // h}"])
        for x in dict.fromkeys((dk // 4, dk // 2))
        if x >= 1
    ]
    layers = sorted({max(1, round(m.encoder_layers * f)) for f in (1 / 3, 2 / 3, 4 / 3)} - {m.encoder_layers})
    for n in layers:
        n_dec = max(1, round(m.decoder_layers * n / m.encoder_layers))
        label = f"C-N{n}" if n_dec == n else f"C-N{n}-{n_dec}"
        out.append(Variation("C", label, [f"model.encoder_layers={n}", f"model.decoder_layers={n_dec}"]))
    out += [Variation("C", f"C-dmodel{x}", [f"model.d_model={x}"]) for x in (d // 2, 2 * d) if x >= 1]
    out += [Variation("C", f"C-dff{x}", [f"model.d_ff={x}"]) for x in (m.d_ff // 2, 2 * m.d_ff) if x >= 1]
    for key, name, base in (("model.dropout", "drop", m.dropout), ("train.label_smoothing", "ls", t.label_smoothing)):
        # the paper: 0 and twice its 0.1; from a higher base, +0.2 (twice 0.3 would drop most of the signal)
        values = (0.0, round(min(2 * base, base + 0.2), 2)) if base > 0 else (0.1, 0.2)
        out += [Variation("D", f"D-{name}{_num(v)}", [f"{key}={_num(v)}"]) for v in values if v != base and v < 1.0]
    other = "learned" if m.positions == "sinusoidal" else "sinusoidal"
    layout = (
        ["model.position_layout=interleaved"] if other == "learned" and m.position_layout != "interleaved" else []
    )  # sinusoids only
    out.append(Variation("E", f"E-{other}", [f"model.positions={other}", *layout]))
    return out


def load_variations(path: str | os.PathLike) -> list[Variation]:
    """Read a variations file: a YAML list of ``{row, name, set}`` mappings (name optional: row + number)."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(
            f"--variations {path}: file not found; "
            "give a YAML list such as the one `tmt sweep --print-variations` writes"
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SweepError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the syntax") from None
    if not isinstance(raw, list) or not raw:
        raise SweepError(
            f"{path}: expected a non-empty YAML list of rows, e.g. - {{row: A, name: h1, set: [model.heads=1]}}"
        )
    out: list[Variation] = []
    counts: dict[str, int] = {}
    for i, item in enumerate(raw, 1):
        where = f"{path}: item {i}"
        if not isinstance(item, dict) or "row" not in item:
            raise SweepError(f"{where}: expected a mapping with 'row' (and 'name', 'set'), got {item!r}")
        unknown = set(item) - {"row", "name", "set"}
        if unknown:
            raise SweepError(
                f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; a row has row, name and set"
            )
        sets = item.get("set") or []
        if isinstance(sets, str):
            sets = [sets]
        if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
            raise SweepError(f"{where}: 'set' must be a list of section.key=value strings, got {sets!r}")
        row = str(item["row"])
        counts[row] = counts.get(row, 0) + 1
        out.append(Variation(row, str(item.get("name") or f"{row}{counts[row]}"), list(sets)))
    check_variations(out, source=str(path))
    return out


def check_variations(variations: list[Variation], *, source: str = "variations") -> None:
    """Names unique and usable as directory names; no row moves its own run directory."""
    seen = set()
    for v in variations:
        if not _NAME.fullmatch(v.name) or v.name in RESERVED:
            raise SweepError(
                f"{source}: row name {v.name!r} cannot name a run directory; "
                f"use letters, digits, '-', '_', '.' (not {' or '.join(RESERVED)})"
            )
        if v.name in seen:
            raise SweepError(f"{source}: two rows are named {v.name!r}; give each row its own name")
        seen.add(v.name)
        for item in v.overrides:
            key = item.split("=", 1)[0].strip()
            if key in ("train.out_dir", "data.cache_dir"):
                raise SweepError(
                    f"{source}: row {v.name}: {key} is set by the sweep (SWEEP_DIR/{v.name}); remove it from the row"
                )


def variations_yaml(variations: list[Variation]) -> str:
    """The list as a variations file (one flow mapping per line)."""

    def plain(text: str) -> str:  # quoted unless YAML reads it back as the same string
        return text if re.fullmatch(r"[A-Za-z_][\w.=+-]*", text) else json.dumps(text)

    return "".join(
        f"- {{row: {plain(v.row)}, name: {plain(v.name)}, set: [{', '.join(map(plain, v.overrides))}]}}\n"
        for v in variations
    )


def select(variations: list[Variation], rows: str | None) -> set[str]:
    """The names chosen by ``--rows A,B`` (labels or names, case-insensitive); all when None."""
    if rows is None:
        return {v.name for v in variations}
    wanted = [r.strip().lower() for r in rows.split(",") if r.strip()]
    chosen = set()
    for w in wanted:
        hits = {v.name for v in variations if w in (v.row.lower(), v.name.lower())}
        if not hits:
            labels = ", ".join(dict.fromkeys([v.row for v in variations] + [v.name for v in variations]))
            raise SweepError(f"--rows {rows}: no row labelled or named {w!r}; choose among {labels}")
        chosen |= hits
    return chosen
