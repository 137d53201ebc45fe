"""`tmt sweep`: Table 3's variations of a base config, trained for one budget each (transformer_mt.sweep)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from transformer_mt.cli.app import app


@app.command()
def sweep(
    config: Path = typer.Option(..., "--config", "-c", help="The base config (YAML); every row is one change of it."),
    set_: list[str] = typer.Option(
        [], "--set", "-s", help="Override one base value for every row: section.key=value (repeatable)."
    ),
    variations: Path | None = typer.Option(
        None,
        "--variations",
        help="YAML list of rows {row, name, set: [...]}; "
        "default: Table 3's rows A-E scaled to the base (see --print-variations).",
    ),
    budget_updates: int | None = typer.Option(
        None, "--budget-updates", min=1, help="Updates per row (replaces the base's limits)."
    ),
    budget_minutes: float | None = typer.Option(
        None,
        "--budget-minutes",
        help="Training minutes per row, validation included "
        "(replaces the base's limits; with --budget-updates, whichever comes first).",
    ),
    rows: str | None = typer.Option(
        None, "--rows", help="Train only these rows: labels or names, comma-separated (e.g. base,A)."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="SWEEP_DIR: one run directory per row, table3.md/.json/.png."
    ),
    print_variations: bool = typer.Option(
        False, "--print-variations", help="Print the variations as a YAML file and exit."
    ),
) -> None:
    """Train Table 3's variations of a base config for the same budget; write the table (markdown, JSON) and a plot.
    A sweep run again continues where it stopped: finished rows are read back, an unfinished one resumes."""
    from transformer_mt.config import load_config
    from transformer_mt.sweep import (
        SweepError,
        budget_overrides,
        load_variations,
        run_sweep,
        table3_variations,
        variations_yaml,
    )

    chosen = load_variations(variations) if variations is not None else None
    if print_variations:
        typer.echo(
            variations_yaml(
                chosen
                or table3_variations(
                    load_config(config, [*set_, *budget_overrides(budget_updates, budget_minutes)], check_files=False)
                )
            ),
            nl=False,
        )
        return
    if output is None:
        raise SweepError("tmt sweep needs -o SWEEP_DIR (where the runs and the table go)")
    command = "tmt " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if Path(sys.argv[0]).name == "tmt" else ""
    report = run_sweep(
        config,
        out_dir=output,
        overrides=list(set_),
        variations=chosen,
        budget_updates=budget_updates,
        budget_minutes=budget_minutes,
        rows=rows,
        command=command,
        log=lambda msg: typer.echo(msg, err=True),
    )
    typer.echo(report.files[1].read_text(encoding="utf-8"))
    typer.echo("wrote " + ", ".join(str(f) for f in report.files), err=True)
    if report.plot_note:
        typer.echo(f"no plot: {report.plot_note}", err=True)
    if report.interrupted:  # saved and resumable: 128 + SIGINT, as `tmt train` exits
        typer.echo("tmt sweep: interrupted; run the same command again to continue", err=True)
        raise typer.Exit(130)
