"""`tmt clean`: drop the pairs of a parallel corpus that the cleaning rules name, keeping the rest."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app

_FLAG = "Sets data.filters.{} (see docs/configuration.md, Cleaning)."


@app.command()
def clean(
    src: Path = typer.Argument(..., help="Source text, one sentence per line."),
    tgt: Path = typer.Argument(..., help="Target text: line i translates line i of SRC."),
    src_lang: str = typer.Option(..., "--src-lang", help="Source language code (en, de, deu_Latn, ...)."),
    tgt_lang: str = typer.Option(..., "--tgt-lang", help="Target language code."),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Output prefix: writes PREFIX.<src-lang>, PREFIX.<tgt-lang>, PREFIX.dropped.tsv, PREFIX.report.json.",
    ),
    out_src: Path | None = typer.Option(None, "--out-src", help="Kept sources (default: PREFIX.<src-lang>)."),
    out_tgt: Path | None = typer.Option(None, "--out-tgt", help="Kept targets (default: PREFIX.<tgt-lang>)."),
    dropped: Path | None = typer.Option(
        None, "--dropped", help="Dropped pairs, a TSV of rule, line, source, target (default: PREFIX.dropped.tsv)."
    ),
    report: Path | None = typer.Option(None, "--report", help="The report as JSON (default: PREFIX.report.json)."),
    config: Path | None = typer.Option(None, "--config", help="A YAML config: its data.filters are the rules."),
    duplicates: str | None = typer.Option(
        None, "--duplicates", help="off, exact or normalized. " + _FLAG.format("duplicates")
    ),
    identical: bool | None = typer.Option(None, "--identical/--no-identical", help=_FLAG.format("identical")),
    min_words: int | None = typer.Option(None, "--min-words", help=_FLAG.format("min_words")),
    max_words: int | None = typer.Option(None, "--max-words", help=_FLAG.format("max_words")),
    max_ratio: float | None = typer.Option(None, "--max-ratio", help=_FLAG.format("max_ratio")),
    max_nonletter: float | None = typer.Option(None, "--max-nonletter", help=_FLAG.format("max_nonletter")),
    script: bool | None = typer.Option(None, "--script/--no-script", help=_FLAG.format("script")),
    langid: bool | None = typer.Option(
        None, "--langid/--no-langid", help=_FLAG.format("langid") + ' Needs pip install -e ".[langid]".'
    ),
    langid_min_prob: float | None = typer.Option(None, "--langid-min-prob", help=_FLAG.format("langid_min_prob")),
) -> None:
    """Drop duplicate, empty, untranslated, over-long, unbalanced, non-letter, wrong-script and wrong-language
    pairs; write the kept pairs, the dropped ones for review and a report."""
    from transformer_mt.cleaning import CleaningError, CleanOutputs, clean_files
    from transformer_mt.config import load_config, validate
    from transformer_mt.text import check_language_code

    for lang, where in ((src_lang, "--src-lang"), (tgt_lang, "--tgt-lang")):
        check_language_code(lang, where)
    explicit = {"src": out_src, "tgt": out_tgt, "dropped": dropped, "report": report}
    if output is None and any(path is None for path in explicit.values()):
        raise CleaningError(
            "give an output prefix with -o PREFIX (or every one of --out-src, --out-tgt, --dropped, --report)"
        )
    defaults = CleanOutputs.from_prefix(output, src_lang, tgt_lang) if output is not None else None
    outputs = CleanOutputs(**{key: path or getattr(defaults, key) for key, path in explicit.items()})
    cfg = load_config(config, check_files=False)
    flags = {
        "duplicates": duplicates,
        "identical": identical,
        "min_words": min_words,
        "max_words": max_words,
        "max_ratio": max_ratio,
        "max_nonletter": max_nonletter,
        "script": script,
        "langid": langid,
        "langid_min_prob": langid_min_prob,
    }
    for key, value in flags.items():
        if value is not None:
            setattr(cfg.data.filters, key, value)
    validate(cfg, source="tmt clean", check_files=False)  # the flags, by the config's own checks
    result = clean_files(src, tgt, outputs, filters=cfg.data.filters, src_lang=src_lang, tgt_lang=tgt_lang)
    typer.echo("\n".join(result.lines()))
    typer.echo(f"wrote {outputs.src}, {outputs.tgt}, {outputs.dropped} and {outputs.report}", err=True)
