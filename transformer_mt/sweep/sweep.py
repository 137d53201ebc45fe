"""`tmt sweep`: the paper's Table 3 at any scale. A base config, a list of variations (one change each),
the same training budget for every variant, and the table of what each change bought.

Variations. A YAML list of rows ``{row: A, name: h1, set: [model.heads=1]}``: ``row`` is the Table 3
label (base, A-E, or any other), ``name`` names the variant and its run directory (unique), ``set`` holds
``--set``-style overrides applied to the base config. Without a file, :func:`table3_variations` scales
the paper's rows to the base model (at the paper's base they are exactly Table 3's): (A) heads 1, h/2, 2h
and 4h with d_k = d_v = d_model/h (the paper: 1, 4, 16, 32 against 8); (B) d_k alone at d_k/4 and d_k/2;
(C) N at N/3, 2N/3, 4N/3, d_model and d_ff halved and doubled; (D) dropout and label smoothing at 0 and
higher; (E) learned positions instead of sinusoids. ``tmt sweep --print-variations`` writes that list.

Each variant is an ordinary ``tmt train`` run in SWEEP_DIR/<name>/, kept. The sweep trains one sentencepiece
model (SWEEP_DIR/tokenizer/, unless the base names one) and one encoded-corpus cache (SWEEP_DIR/cache/)
shared by every row that does not change ``tokenizer.*``, so the rows differ only in what they vary.

Resume. Before a row trains, SWEEP_DIR/<name>/sweep_row.json records the config it asked for; when the
row ends it also records the result (``status: done``). A sweep run again reads finished rows back from
these files and trains nothing for them. An unfinished row (killed, or stopped by Ctrl-C) continues with
``tmt train --resume`` semantics from its newest checkpoint: the trainer's exact resume, so the row ends as
an uninterrupted one would, and a time budget counts the minutes already spent (``Progress.elapsed``).
A row killed before its first checkpoint starts again. A row directory that records another config
(a changed budget, base or variation) is refused rather than silently mixed into the table.

A variation the config checks refuse (d_model not divisible by h, an unknown key) is reported as that
row's status, ``invalid``, with the reason; a run that diverges is ``failed``. Neither stops the sweep.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from transformer_mt.config import Config, ConfigError, load_config, to_dict
from transformer_mt.errors import TmtError

MARKER = "sweep_row.json"
RESERVED = ("tokenizer", "cache")  # SWEEP_DIR entries that are not rows
# Settings that change where or how fast a row runs, not what it computes: left out of the recorded config.
UNRECORDED = {"train": ("out_dir", "threads", "device", "log_every"), "data": ("cache_dir",)}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


class SweepError(TmtError, ValueError):
    """A sweep that cannot run as asked: one line naming the file, row or option and the fix."""


@dataclass
class Variation:
    """One row of the table: a label, a unique name and the overrides that make it from the base."""

    row: str  # Table 3 label: base, A, B, C, D, E (or any)
    name: str  # the variant and its run directory, SWEEP_DIR/<name>
    overrides: list[str] = field(default_factory=list)  # section.key=value, as `tmt train --set`


# ---------------------------------------------------------------- the variations
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
        Variation("B", f"B-dk{x}", [f"model.head_dim={x}", f"model.value_dim={m.value_dim or d // h}"]) for x in dict.fromkeys((dk // 4, dk // 2)) if x >= 1
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
    out.append(Variation("E", f"E-{other}", [f"model.positions={other}"]))
    return out


def load_variations(path: str | os.PathLike) -> list[Variation]:
    """Read a variations file: a YAML list of ``{row, name, set}`` mappings (name optional: row + number)."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"--variations {path}: file not found; give a YAML list such as the one `tmt sweep --print-variations` writes")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SweepError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the syntax") from None
    if not isinstance(raw, list) or not raw:
        raise SweepError(f"{path}: expected a non-empty YAML list of rows, e.g. - {{row: A, name: h1, set: [model.heads=1]}}")
    out, counts = [], {}
    for i, item in enumerate(raw, 1):
        where = f"{path}: item {i}"
        if not isinstance(item, dict) or "row" not in item:
            raise SweepError(f"{where}: expected a mapping with 'row' (and 'name', 'set'), got {item!r}")
        unknown = set(item) - {"row", "name", "set"}
        if unknown:
            raise SweepError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; a row has row, name and set")
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
            raise SweepError(f"{source}: row name {v.name!r} cannot name a run directory; use letters, digits, '-', '_', '.' (not {' or '.join(RESERVED)})")
        if v.name in seen:
            raise SweepError(f"{source}: two rows are named {v.name!r}; give each row its own name")
        seen.add(v.name)
        for item in v.overrides:
            key = item.split("=", 1)[0].strip()
            if key in ("train.out_dir", "data.cache_dir"):
                raise SweepError(f"{source}: row {v.name}: {key} is set by the sweep (SWEEP_DIR/{v.name}); remove it from the row")


def variations_yaml(variations: list[Variation]) -> str:
    """The list as a variations file (one flow mapping per line)."""

    def plain(text: str) -> str:  # quoted unless YAML reads it back as the same string
        return text if re.fullmatch(r"[A-Za-z_][\w.=+-]*", text) else json.dumps(text)

    return "".join(f"- {{row: {plain(v.row)}, name: {plain(v.name)}, set: [{', '.join(map(plain, v.overrides))}]}}\n" for v in variations)


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


# ---------------------------------------------------------------- one row's config and record
def budget_overrides(updates: int | None, minutes: float | None) -> list[str]:
    """The same budget for every row: --budget-updates and/or --budget-minutes replace the base's limits."""
    if updates is None and minutes is None:
        return []
    if updates is not None and updates < 1:
        raise SweepError(f"--budget-updates {updates}: must be at least 1")
    if minutes is not None and not (math.isfinite(minutes) and minutes > 0):
        raise SweepError(f"--budget-minutes {minutes}: must be a positive number of minutes")
    return [f"train.max_updates={updates or 0}", f"train.max_time={minutes or 0}", "train.max_epochs=0"]


def recorded(cfg: Config) -> dict[str, Any]:
    """What a row computes: its config without the settings of UNRECORDED."""
    out = to_dict(cfg)
    for section, keys in UNRECORDED.items():
        for key in keys:
            out[section].pop(key, None)
    return out


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_marker(run_dir: Path, record: dict[str, Any]) -> None:
    """sweep_row.json, replaced atomically (a kill leaves the old or the new one)."""
    tmp = run_dir / f".{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / MARKER)


def _first_difference(a: dict, b: dict) -> str:
    for section in sorted(set(a) | set(b)):
        for key in sorted(set(a.get(section, {})) | set(b.get(section, {}))):
            x, y = a.get(section, {}).get(key), b.get(section, {}).get(key)
            if x != y:
                return f"{section}.{key} was {x!r}, now {y!r}"
    return "nothing"


def read_result(run_dir: Path) -> dict[str, Any]:
    """Updates, wall time, validation and stop reason of a finished run, from its metrics.jsonl (runlog.py's
    records: the last "summary", and the "valid" record of that update when the summary has none)."""
    summary, valid = None, None
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:  # a line torn by a kill
            continue
        if isinstance(rec, dict) and rec.get("kind") == "summary":
            summary = rec
        elif isinstance(rec, dict) and rec.get("kind") == "valid":
            valid = rec
    if summary is None:
        raise SweepError(f"{path}: no summary record; the run did not finish (run the sweep again to continue it)")
    val = dict(summary.get("last_valid") or {})
    if not val and valid is not None and valid.get("update") == summary["update"]:
        val = {k: v for k, v in valid.items() if k.startswith("val_")}
    return {
        "updates": summary["update"],
        "wall_s": summary["wall"],
        "stop_reason": summary["stop_reason"],
        "val_ppl": val.get("val_ppl"),
        "val_bleu": val.get("val_bleu"),
    }


def trained_parameters(checkpoint: Path) -> int:
    """sum(p.numel()) of the model rebuilt from `checkpoint` with its weights (tied matrices once)."""
    from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, unpack_tokenizers
    from transformer_mt.model import Transformer, count_parameters
    from transformer_mt.text import Tokenizer

    state = load_checkpoint(checkpoint)
    cfg = config_from_checkpoint(state, source=str(checkpoint))
    src, tgt = (Tokenizer(proto) for proto in unpack_tokenizers(state, source=str(checkpoint)))
    model = Transformer(cfg.model, src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size)
    model.load_state_dict(state["model"])
    return count_parameters(model)


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


# ---------------------------------------------------------------- the sweep
@dataclass
class SweepReport:
    """What `run_sweep` made: the rows (as in table3.json) and the files written."""

    rows: list[dict[str, Any]]
    files: list[Path]
    interrupted: bool  # a row stopped by a signal (saved, resumable): the sweep stopped there
    plot_note: str = ""  # why no picture was drawn, when none was


@dataclass
class _Row:
    variation: Variation
    result: dict[str, Any]  # the row of table3.json
    cfg: Config | None = None  # base + budget + the row's overrides; None when invalid
    todo: bool = False  # train (or resume) it now


def run_sweep(
    config: str | os.PathLike,
    *,
    out_dir: str | os.PathLike,
    overrides: list[str] = (),
    variations: list[Variation] | None = None,
    budget_updates: int | None = None,
    budget_minutes: float | None = None,
    rows: str | None = None,
    command: str = "",
    log: Callable[[str], None] | None = None,
) -> SweepReport:
    """Train every selected variation of `config` for the same budget into OUT_DIR/<name> (continuing what an
    earlier sweep left unfinished) and write OUT_DIR/table3.{md,json,png} after each row; see the module docstring."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out_dir).resolve()
    common = [*overrides, *budget_overrides(budget_updates, budget_minutes)]
    base = load_config(config, common)  # a base (or --set) the checks refuse stops the sweep: every row would fail
    t = base.train
    if not (t.max_updates or t.max_time or t.max_epochs):
        raise SweepError(f"{config}: no training budget (train.max_updates, max_time and max_epochs are 0); give --budget-updates or --budget-minutes")
    variations = table3_variations(base) if variations is None else variations
    check_variations(variations)
    chosen = select(variations, rows)
    plans = [_plan(v, config, common, out, selected=v.name in chosen) for v in variations]  # refuses before training anything
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "base_config": str(config),
        "overrides": list(overrides),
        "command": command,
        "budget": {"updates": t.max_updates, "minutes": t.max_time, "epochs": t.max_epochs},
        "bleu": {"metric": "sacreBLEU cased 13a", "beam": t.valid_beam, "lenpen": base.decode.lenpen, "sentences": t.valid_bleu_sentences},
    }
    shared: list[str] = []  # the shared tokenizer's overrides, made at the first row that needs them
    interrupted = False
    files, note = write_outputs(out, [p.result for p in plans], meta)
    for plan in plans:
        if plan.todo and not interrupted:
            interrupted = _train_row(plan, config, common, base, out, shared, log)
            files, note = write_outputs(out, [p.result for p in plans], meta)  # a partial table after each row
    return SweepReport([p.result for p in plans], files, interrupted, note)


def _plan(v: Variation, config: str | os.PathLike, common: list[str], out: Path, *, selected: bool) -> _Row:
    """What a row needs: nothing (finished, invalid, not selected) or training, new or resumed."""
    run_dir = out / v.name
    plan = _Row(v, {"row": v.row, "name": v.name, "set": list(v.overrides), "status": "not run", "note": "", "run_dir": str(run_dir)})
    try:
        plan.cfg = load_config(config, [*common, *v.overrides])
    except ConfigError as exc:  # d_model not divisible by h, an unknown key, ...: the row's status, not the sweep's end
        plan.result.update(status="invalid", note=str(exc))
        return plan
    plan.result.update(columns(plan.cfg))
    marker = read_marker(run_dir)
    if marker is not None and marker.get("config") != recorded(plan.cfg):
        what = _first_difference(marker.get("config") or {}, recorded(plan.cfg))
        if selected:
            raise SweepError(f"{run_dir}: this row was trained with another config ({what}); use another -o SWEEP_DIR, or delete {run_dir} to train it again")
        plan.result["note"] = f"holds a run with another config ({what})"
    elif marker is not None and marker.get("status") in ("done", "failed"):
        plan.result.update(marker.get("result") or {})
    elif marker is None and any(run_dir.glob("checkpoint*.pt")):
        raise SweepError(f"{run_dir}: holds a run that tmt sweep did not start (no {MARKER}); remove it or use another -o SWEEP_DIR")
    else:
        plan.todo = selected
        if not selected:
            plan.result["note"] = "not selected by --rows" if marker is None else "unfinished; select it with --rows to continue"
    return plan


def _shared_tokenizer(base: Config, out: Path, log: Callable[[str], None]) -> list[str]:
    """Train (or reuse) the sweep's sentencepiece model(s) in OUT/tokenizer; the overrides that point a row at them."""
    import dataclasses

    from transformer_mt.data import prepare_tokenizers

    where = out / "tokenizer"
    where.mkdir(parents=True, exist_ok=True)
    prepare_tokenizers(dataclasses.replace(base, train=dataclasses.replace(base.train, out_dir=str(where))), log=log)
    names = (("model", "spm.model"),) if base.tokenizer.joint else (("model", "spm.src.model"), ("tgt_model", "spm.tgt.model"))
    return [f"tokenizer.{key}={json.dumps(str(where / name))}" for key, name in names]


def _train_row(plan: _Row, config: str | os.PathLike, common: list[str], base: Config, out: Path, shared: list[str], log: Callable[[str], None]) -> bool:
    """Train or resume one row into OUT/<name> and fill its result. True when a signal stopped it (saved, resumable)."""
    import torch

    from transformer_mt.training import TrainError, train

    v, row, run_dir = plan.variation, plan.result, out / plan.variation.name
    sets = [f"train.out_dir={json.dumps(str(run_dir))}"]
    if not plan.cfg.data.cache_dir:
        sets.append(f"data.cache_dir={json.dumps(str(out / 'cache'))}")
    if not plan.cfg.tokenizer.model and plan.cfg.tokenizer == base.tokenizer:
        shared[:] = shared or _shared_tokenizer(base, out, log)
        sets += shared
    cfg = load_config(config, [*common, *v.overrides, *sets])
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = read_marker(run_dir) or {"config": recorded(plan.cfg), "status": "started"}
    write_marker(run_dir, marker)  # before training: a killed row is then known as this sweep's, with this config
    resume = any(run_dir.glob("checkpoint*.pt"))
    log(f"tmt sweep: row {v.row} {v.name} ({', '.join(v.overrides) or 'the base'}): {'resuming' if resume else 'training'} in {run_dir}")
    try:
        result = train(cfg, resume=resume, overwrite=not resume)  # overwrite: a start killed before its first checkpoint
    except ConfigError as exc:  # the trainer's own checks (e.g. a validation beam too large for the vocabulary)
        row.update(status="invalid", note=str(exc))
        return False
    except (TrainError, torch.OutOfMemoryError) as exc:  # diverged, or too big for the device: the next rows still run
        row.update(status="failed", note=str(exc).splitlines()[0])
        write_marker(run_dir, {**marker, "status": "failed", "result": {"status": "failed", "note": row["note"]}})
        return False
    if result.stop_reason == "interrupted":
        row.update(status="interrupted", note=f"saved at update {result.progress.update}; run the sweep again to continue")
        return True
    done = {**read_result(run_dir), "params": trained_parameters(run_dir / "checkpoint_last.pt"), "status": "done", "note": ""}
    row.update(done)
    write_marker(run_dir, {**marker, "status": "done", "result": done})
    log(f"tmt sweep: row {v.name}: {done['updates']} updates, val BLEU {done['val_bleu']}, {done['params']:,} parameters")
    return False


# ---------------------------------------------------------------- the table and the picture
COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions")


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
        for x in (f"{b['updates']} updates" * bool(b["updates"]), f"{b['minutes']:g} minutes" * bool(b["minutes"]), f"{b['epochs']} epochs" * bool(b["epochs"]))
        if x
    )
    search = "greedy" if bl["beam"] == 1 else f"beam {bl['beam']}, lenpen {bl['lenpen']:g}"
    sentences = {0: "all validation sentences", -1: "no sentences (BLEU off)"}.get(bl["sentences"], f"the first {bl['sentences']} validation sentences")
    lines = [
        f"# Table 3 variations of `{meta['base_config']}`",
        "",
        f"Each row trained for the same budget ({budget}) from the base config"
        + (f" with `{' '.join('--set ' + o for o in meta['overrides'])}`" if meta["overrides"] else "")
        + ". "
        f"val BLEU: {bl['metric']} on {sentences}, {search}. val PPL: per-piece perplexity exp(NLL), no label smoothing, "
        "whole validation set. params: sum(p.numel()) of the trained model (tied matrices once). wall: training minutes, "
        "validation included. Blank cells equal the base row." + (f"\n\nCommand: `{meta['command']}`" if meta["command"] else ""),
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


def write_outputs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[list[Path], str]:
    """OUT/table3.json, table3.md and (with matplotlib) table3.png; returns the files and why there is no picture."""
    from transformer_mt.viz import VizError

    files = [out / "table3.json", out / "table3.md"]
    for path, text in zip(files, (json.dumps({**meta, "rows": rows}, indent=1) + "\n", markdown(rows, meta))):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    b = meta["budget"]
    budget = f"{b['updates']} updates" if b["updates"] else f"{b['minutes']:g} min" if b["minutes"] else f"{b['epochs']} epochs"
    title = f"{Path(meta['base_config']).name}: val BLEU after {budget}"
    try:
        picture = plot_bleu(rows, out / "table3.png", title=title)
    except VizError as exc:  # no matplotlib: the table is written all the same
        return files, str(exc)
    return files + [picture] * (picture is not None), "" if picture else "no finished row with a BLEU yet"
