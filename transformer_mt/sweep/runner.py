"""Running a sweep: one ordinary `tmt train` run per row, the same budget for each, resumable.

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
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_mt.config import Config, ConfigError, load_config, to_dict
from transformer_mt.sweep.report import columns, write_outputs
from transformer_mt.sweep.variations import SweepError, Variation, check_variations, select, table3_variations

MARKER = "sweep_row.json"
# Settings that change where or how fast a row runs, not what it computes: left out of the recorded config.
UNRECORDED = {"train": ("out_dir", "threads", "device", "log_every"), "data": ("cache_dir",)}


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
    from transformer_mt.decoding import model_from_checkpoint
    from transformer_mt.model import count_parameters

    return count_parameters(model_from_checkpoint(checkpoint, weights="raw").model)


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
    overrides: Sequence[str] = (),
    variations: list[Variation] | None = None,
    budget_updates: int | None = None,
    budget_minutes: float | None = None,
    rows: str | None = None,
    command: str = "",
    log: Callable[[str], None] | None = None,
) -> SweepReport:
    """Train every selected variation of `config` for the same budget into OUT_DIR/<name> (continuing what an
    earlier sweep left unfinished) and write OUT_DIR/table3.{md,json,png} after each row (with nothing to train,
    only when they would change); see the module docstring."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Path(out_dir).resolve()
    common = [*overrides, *budget_overrides(budget_updates, budget_minutes)]
    base = load_config(config, common)  # a base (or --set) the checks refuse stops the sweep: every row would fail
    t = base.train
    if not (t.max_updates or t.max_time or t.max_epochs):
        raise SweepError(
            f"{config}: no training budget (train.max_updates, max_time and max_epochs are 0); "
            "give --budget-updates or --budget-minutes"
        )
    variations = table3_variations(base) if variations is None else variations
    check_variations(variations)
    chosen = select(variations, rows)
    plans = [
        _plan(v, config, common, out, selected=v.name in chosen) for v in variations
    ]  # refuses before training anything
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "base_config": str(config),
        "overrides": list(overrides),
        "command": command,
        "budget": {"updates": t.max_updates, "minutes": t.max_time, "epochs": t.max_epochs},
        "bleu": {
            "metric": "sacreBLEU cased 13a",
            "beam": t.valid_beam,
            "lenpen": base.decode.lenpen,
            "sentences": t.valid_bleu_sentences,
        },
    }
    shared: list[str] = []  # the shared tokenizer's overrides, made at the first row that needs them
    interrupted, trained = False, False
    files: list[Path] = []
    note = ""
    for plan in plans:
        if plan.todo and not interrupted:
            interrupted, trained = _train_row(plan, config, common, base, out, shared, log), True
            files, note = write_outputs(out, [p.result for p in plans], meta)  # a partial table after each row
    if not trained:  # rows read back: the table is written only when it would change (never before any training)
        files, note = write_outputs(out, [p.result for p in plans], meta, unless_unchanged=True)
    return SweepReport([p.result for p in plans], files, interrupted, note)


def _plan(v: Variation, config: str | os.PathLike, common: list[str], out: Path, *, selected: bool) -> _Row:
    """What a row needs: nothing (finished, invalid, not selected) or training, new or resumed."""
    run_dir = out / v.name
    plan = _Row(
        v,
        {
            "row": v.row,
            "name": v.name,
            "set": list(v.overrides),
            "status": "not run",
            "note": "",
            "run_dir": str(run_dir),
        },
    )
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
            raise SweepError(
                f"{run_dir}: this row was trained with another config ({what}); "
                f"use another -o SWEEP_DIR, or delete {run_dir} to train it again"
            )
        plan.result["note"] = f"holds a run with another config ({what})"
    elif marker is not None and marker.get("status") in ("done", "failed"):
        plan.result.update(marker.get("result") or {})
    elif marker is None and any(run_dir.glob("checkpoint*.pt")):
        raise SweepError(
            f"{run_dir}: holds a run that tmt sweep did not start (no {MARKER}); remove it or use another -o SWEEP_DIR"
        )
    else:
        plan.todo = selected
        if not selected:
            plan.result["note"] = (
                "not selected by --rows" if marker is None else "unfinished; select it with --rows to continue"
            )
    return plan


def _shared_tokenizer(base: Config, out: Path, log: Callable[[str], None]) -> list[str]:
    """Train (or reuse) the sweep's sentencepiece model(s) in OUT/tokenizer; the overrides that point a row at them."""
    import dataclasses

    from transformer_mt.data import prepare_tokenizers

    where = out / "tokenizer"
    where.mkdir(parents=True, exist_ok=True)
    prepare_tokenizers(dataclasses.replace(base, train=dataclasses.replace(base.train, out_dir=str(where))), log=log)
    names = (
        (("model", "spm.model"),)
        if base.tokenizer.joint
        else (("model", "spm.src.model"), ("tgt_model", "spm.tgt.model"))
    )
    return [f"tokenizer.{key}={json.dumps(str(where / name))}" for key, name in names]


def _train_row(
    plan: _Row,
    config: str | os.PathLike,
    common: list[str],
    base: Config,
    out: Path,
    shared: list[str],
    log: Callable[[str], None],
) -> bool:
    """Train or resume one row into OUT/<name> and fill its result. True when a signal stopped it (saved, resumable)."""
    import torch

    from transformer_mt import training  # training.train looked up at call time: tests replace it

    v, row, run_dir, row_cfg = plan.variation, plan.result, out / plan.variation.name, plan.cfg
    assert row_cfg is not None, "a row to train has a valid config (_plan)"
    sets = [f"train.out_dir={json.dumps(str(run_dir))}"]
    if not row_cfg.data.cache_dir:
        sets.append(f"data.cache_dir={json.dumps(str(out / 'cache'))}")
    if not row_cfg.tokenizer.model and row_cfg.tokenizer == base.tokenizer:
        shared[:] = shared or _shared_tokenizer(base, out, log)
        sets += shared
    cfg = load_config(config, [*common, *v.overrides, *sets])
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = read_marker(run_dir) or {"config": recorded(row_cfg), "status": "started"}
    write_marker(run_dir, marker)  # before training: a killed row is then known as this sweep's, with this config
    resume = any(run_dir.glob("checkpoint*.pt"))
    log(
        f"tmt sweep: row {v.row} {v.name} ({', '.join(v.overrides) or 'the base'}): "
        f"{'resuming' if resume else 'training'} in {run_dir}"
    )
    try:
        result = training.train(
            cfg, resume=resume, overwrite=not resume
        )  # overwrite: a start killed before its first checkpoint
    except ConfigError as exc:  # the trainer's own checks (e.g. a validation beam too large for the vocabulary)
        row.update(status="invalid", note=str(exc))
        return False
    except (
        training.TrainError,
        torch.OutOfMemoryError,
    ) as exc:  # diverged, or too big for the device: the next rows still run
        row.update(status="failed", note=str(exc).splitlines()[0])
        write_marker(run_dir, {**marker, "status": "failed", "result": {"status": "failed", "note": row["note"]}})
        return False
    if result.stop_reason == "interrupted":
        row.update(
            status="interrupted", note=f"saved at update {result.progress.update}; run the sweep again to continue"
        )
        return True
    done = {
        **read_result(run_dir),
        "params": trained_parameters(run_dir / "checkpoint_last.pt"),
        "status": "done",
        "note": "",
    }
    row.update(done)
    write_marker(run_dir, {**marker, "status": "done", "result": done})
    log(
        f"tmt sweep: row {v.name}: {done['updates']} updates, val BLEU {done['val_bleu']}, "
        f"{done['params']:,} parameters"
    )
    return False
