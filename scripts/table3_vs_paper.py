#!/usr/bin/env python
"""Put a `tmt sweep` of the default Table 3 rows beside the paper's Table 3.

    python scripts/table3_vs_paper.py runs/table3/table3.json [-o docs/table3.md] [--header TEXT]

Reads the sweep's table3.json (written by `tmt sweep`), matches each of our rows to the paper's row it
scales (configs/sweeps/table3.yaml: heads 1, h/2, 2h, 4h are the paper's 1, 4, 16, 32; d_k/4 and d_k/2 its
16 and 32; N/3, 2N/3, 4N/3 its 2, 4, 8; halved and doubled d_model and d_ff; dropout and label smoothing
at 0 and higher; learned positions) and writes one markdown table: our val BLEU and its change from our
base, the paper's newstest2013 BLEU and its change from its base, both perplexities, both parameter
counts. The paper's values are transcribed from Vaswani et al. (2017), Table 3 (dev set newstest2013,
beam 4 without checkpoint averaging, 100K steps of ~25k tokens; per-wordpiece perplexity).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# name in configs/sweeps/table3.yaml -> (the paper's row as printed, PPL (dev), BLEU (dev), params x 10^6)
PAPER = {
    "base": ("base: N 6, d_model 512, d_ff 2048, h 8, d_k 64", 4.92, 25.8, 65),
    "A-h1": ("h 1, d_k = d_v 512", 5.29, 24.9, 65),
    "A-h2": ("h 4, d_k = d_v 128", 5.00, 25.5, 65),
    "A-h8": ("h 16, d_k = d_v 32", 4.91, 25.8, 65),
    "A-h16": ("h 32, d_k = d_v 16", 5.01, 25.4, 65),
    "B-dk8": ("d_k 16", 5.16, 25.1, 58),
    "B-dk16": ("d_k 32", 5.01, 25.4, 60),
    "C-N1": ("N 2", 6.11, 23.7, 36),
    "C-N3": ("N 4", 5.19, 25.3, 50),
    "C-N5": ("N 8", 4.88, 25.5, 80),
    "C-dmodel64": ("d_model 256, d_k = d_v 32", 5.75, 24.5, 28),
    "C-dmodel256": ("d_model 1024, d_k = d_v 128", 4.66, 26.0, 168),
    "C-dff128": ("d_ff 1024", 5.12, 25.4, 53),
    "C-dff512": ("d_ff 4096", 4.75, 26.2, 90),
    "D-drop0": ("P_drop 0.0", 5.77, 24.6, 65),
    "D-drop0.5": ("P_drop 0.2", 4.95, 25.5, 65),
    "D-ls0": ("eps_ls 0.0", 4.67, 25.3, 65),
    "D-ls0.2": ("eps_ls 0.2", 5.47, 25.7, 65),
    "E-learned": ("positional embedding instead of sinusoids", 4.92, 25.7, 65),
}


def signed(x: float, fmt: str = "+.1f") -> str:
    return format(x, fmt)


def render(sweep: dict) -> str:
    rows = {r["name"]: r for r in sweep["rows"]}
    base = rows.get("base")
    if not base or base.get("status") != "done":
        raise SystemExit("table3_vs_paper: the sweep has no finished 'base' row; run the sweep to the end first")
    _, p_ppl0, p_bleu0, _ = PAPER["base"]
    bl = sweep["bleu"]
    search = "greedy" if bl["beam"] == 1 else f"beam {bl['beam']}, lenpen {bl['lenpen']:g}"
    out = [
        "| row | ours: variant | ours: val BLEU | ours: Δ | paper: variant | paper: BLEU | paper: Δ "
        "| ours: val PPL | paper: PPL | ours: params | paper: params (M) | ours: wall (min) |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sweep["rows"]:
        name = r["name"]
        label, p_ppl, p_bleu, p_params = PAPER.get(name, ("(not in the paper)", None, None, None))
        change = ", ".join(s.split(".", 1)[1] for s in r["set"]) or "—"
        if r.get("status") != "done":
            out.append(
                f"| {r['row']} | {change} | {r.get('status')} {r.get('note', '')} | | {label} | {p_bleu or ''} "
                f"| | | | | {p_params or ''} | |"
            )
            continue
        ours = f"{r['val_bleu']:.2f}"
        d_ours = "" if name == "base" else signed(r["val_bleu"] - base["val_bleu"], "+.2f")
        d_paper = "" if name == "base" or p_bleu is None else signed(p_bleu - p_bleu0)
        out.append(
            f"| {r['row']} | {change} | {ours} | {d_ours} | {label} | {p_bleu if p_bleu is not None else ''} "
            f"| {d_paper} | {r['val_ppl']:.2f} | {p_ppl if p_ppl is not None else ''} | {r['params'] / 1e6:.2f}M "
            f"| {p_params or ''} | {r['wall_s'] / 60:.1f} |"
        )
    head = (
        f"Ours: `{sweep['command']}`; every row {sweep['budget']['updates'] or ''} updates"
        f"{' / ' + format(sweep['budget']['minutes'], 'g') + ' minutes' if sweep['budget']['minutes'] else ''}, "
        f"val BLEU = {bl['metric']} on Multi30k val ({search}), val PPL per piece without label smoothing. "
        f"Paper: Vaswani et al. (2017) Table 3, newstest2013 BLEU (beam 4) and per-wordpiece PPL after 100K steps; "
        f"its base is BLEU {p_bleu0}, PPL {p_ppl0}. Δ: change from the same table's base row."
    )
    return head + "\n\n" + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep_json", type=Path)
    p.add_argument("-o", "--output", type=Path, default=None, help="write the table here (default: print it)")
    args = p.parse_args(argv)
    text = render(json.loads(args.sweep_json.read_text(encoding="utf-8")))
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
