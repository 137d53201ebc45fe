"""`tmt inspect`, `tmt plot` and `tmt attention`: see inside a model and its training (transformer_mt.viz)."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import app


@app.command("inspect")
def inspect_cmd(
    target: Path = typer.Argument(..., help="A YAML config (built without weights) or a checkpoint (.pt)."),
    set_: list[str] = typer.Option(
        [], "--set", "-s", help="Override one config value: section.key=value (repeatable; configs only)."
    ),
    src_len: int = typer.Option(10, "--src-len", help="Source length S of the example batch and of the FLOPs count."),
    tgt_len: int = typer.Option(
        8, "--tgt-len", help="Target length T (BOS + pieces) of the example batch and of the FLOPs count."
    ),
    layers: int = typer.Option(
        1, "--layers", help="Layers per stack shown with their insides (the others get one line each)."
    ),
    pe: Path | None = typer.Option(
        None, "--pe", help="Also draw the positional-encoding matrix to this PNG (or .svg); needs matplotlib."
    ),
    pe_length: int = typer.Option(100, "--pe-length", help="Positions drawn by --pe."),
) -> None:
    """The architecture as a tree: parameters per module, tensor shapes of one example batch, FLOPs per token."""
    from transformer_mt.viz import VizError
    from transformer_mt.viz.inspect import inspect_report, load_model

    if src_len < 1 or tgt_len < 1 or pe_length < 2:
        raise VizError(
            f"--src-len {src_len} --tgt-len {tgt_len} --pe-length {pe_length}: lengths must be >= 1 (--pe-length >= 2)"
        )
    model, cfg, vocab = load_model(target, list(set_))
    lines, _ = inspect_report(
        model, cfg, vocab=vocab, source=str(target), src_len=src_len, tgt_len=tgt_len, full_layers=layers
    )
    if pe is not None:
        typer.echo(f"positional encoding: {_draw_positions(model, cfg, pe, pe_length)}")
    typer.echo("\n".join(lines))


def _draw_positions(model, cfg, out: Path, length: int) -> Path:
    from transformer_mt.analysis import position_table
    from transformer_mt.model import sinusoids
    from transformer_mt.viz import VizError
    from transformer_mt.viz.positions import plot_positions

    layout = cfg.model.position_layout if cfg.model.positions == "sinusoidal" else None
    name = f"sinusoids ({layout})" if layout else "learned positions"
    if next(model.parameters()).device.type != "meta":
        table, title = position_table(model, length), name  # the model's own table (learned: its trained values)
    elif layout:
        table, title = sinusoids(length, cfg.model.d_model, layout=layout), name
    else:
        raise VizError(
            "model.positions=learned: a config has no learned values to draw; give a trained checkpoint (.pt) instead"
        )
    return plot_positions(table, out, layout=layout, title=title)


@app.command()
def plot(
    runs: list[Path] = typer.Argument(
        ..., help="Run directories (train.out_dir) whose metrics.jsonl to draw; several are overlaid."
    ),
    output: Path = typer.Option(Path("curves.png"), "--output", "-o", help="The picture to write (.png or .svg)."),
) -> None:
    """Training curves: train loss, validation loss and BLEU against updates and wall-clock, one PNG."""
    from transformer_mt.viz.curves import plot_runs

    typer.echo(plot_runs(runs, output))


@app.command()
def attention(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", "-c", help="A checkpoint written by `tmt train` or `tmt average`."
    ),
    file: Path | None = typer.Argument(None, help="A source text file; with --line N its N-th line is drawn."),
    src: str | None = typer.Option(None, "--src", help="The source sentence (instead of FILE --line N)."),
    line: int | None = typer.Option(None, "--line", help="Line number (1-based) of FILE."),
    ref: str | None = typer.Option(
        None, "--ref", help="Teacher-force this target instead of drawing the model's translation."
    ),
    layers: str | None = typer.Option(
        None, "--layers", help="Layers to draw, 0-based and comma-separated (e.g. 0,2); default all."
    ),
    heads: str | None = typer.Option(None, "--heads", help="Heads to draw, 0-based and comma-separated; default all."),
    beam: int | None = typer.Option(
        None, "--beam", "-b", help="Beam size of the translation. Default: the checkpoint's decode.beam."
    ),
    svg: bool = typer.Option(False, "--svg", help="Also write SVG files beside the PNGs."),
    output: Path = typer.Option(
        Path("attention"), "--output", "-o", help="Directory for the pictures and attention.json."
    ),
) -> None:
    """Attention maps of one sentence: encoder self, decoder self (causal) and cross-attention, per layer and head."""
    from transformer_mt.analysis import sentence_maps
    from transformer_mt.config import beam_problem
    from transformer_mt.decoding import Translator
    from transformer_mt.viz import VizError
    from transformer_mt.viz.attention import parse_indices, read_line, write_maps

    if (src is None) == (file is None) or (file is not None) != (line is not None):
        raise VizError('give the sentence either as --src "text" or as FILE --line N')
    layer_ids, head_ids = parse_indices(layers, "--layers"), parse_indices(heads, "--heads")
    if src is None:
        assert file is not None and line is not None  # checked above: FILE --line N when there is no --src
        src = read_line(file, line)
    problem = None if beam is None else beam_problem(beam)
    if problem:
        raise VizError(f"--beam {problem.value} {problem.reason}")
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    maps = sentence_maps(translator, src, reference=ref, beam=beam).select(layer_ids, head_ids)
    typer.echo(f"source: {maps.source}\n{'reference' if maps.teacher_forced else 'translation'}: {maps.target}")
    for path in write_maps(maps, output, svg=svg):
        typer.echo(path)
