"""scripts/table3_vs_paper.py: our rows beside the paper's Table 3, deltas from each table's own base."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "table3_vs_paper.py"


def load_script():
    spec = importlib.util.spec_from_file_location("table3_vs_paper", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(name: str, label: str, sets: list[str], bleu: float, *, status: str = "done") -> dict:
    return {
        "row": label,
        "name": name,
        "set": sets,
        "status": status,
        "note": "",
        "val_bleu": bleu,
        "val_ppl": 10.0,
        "params": 2_000_000,
        "wall_s": 120.0,
    }


SWEEP: dict[str, Any] = {
    "command": "tmt sweep ...",
    "budget": {"updates": 400, "minutes": 0.0},
    "bleu": {"metric": "sacreBLEU cased 13a", "beam": 1, "lenpen": 1.0},
    "rows": [
        row("base", "base", [], 18.5),
        row("A-h1", "A", ["model.heads=1"], 17.25),
        row("C-N1", "C", ["model.encoder_layers=1"], 20.0),
        row("E-learned", "E", ["model.positions=learned"], 0.0, status="not run"),
    ],
}


def test_deltas_are_from_each_tables_own_base(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(SWEEP))
    out = tmp_path / "t.md"
    load_script().main([str(path), "-o", str(out)])
    lines = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
        for line in out.read_text().splitlines()
        if line.startswith("| ")
    }
    h1 = lines["heads=1"]
    assert h1[2:7] == ["17.25", "-1.25", "h 1, d_k = d_v 512", "24.9", "-0.9"]  # ours 17.25 - 18.5; paper 24.9 - 25.8
    n1 = lines["encoder_layers=1"]
    assert n1[3] == "+1.50" and n1[5:7] == ["23.7", "-2.1"]  # paper: N 2 is 23.7 against 25.8
    assert lines["positions=learned"][2].startswith("not run")


def test_without_a_finished_base_it_says_so(tmp_path):
    sweep = dict(SWEEP, rows=[dict(SWEEP["rows"][0], status="not run")] + SWEEP["rows"][1:])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(sweep))
    with pytest.raises(SystemExit, match="no finished 'base' row"):
        load_script().main([str(path)])
