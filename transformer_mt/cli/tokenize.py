"""`tmt tokenize train | encode | decode`: sentencepiece models and text <-> pieces."""

from __future__ import annotations

from pathlib import Path

import typer

from transformer_mt.cli.app import tokenize_app
from transformer_mt.cli.common import input_lines, progress, safe_output


@tokenize_app.command("train")
def tokenize_train(
    inputs: list[Path] = typer.Option(
        ..., "--input", "-i", help="Text file to learn from; repeat for source and target to get a joint vocabulary."
    ),
    model_prefix: Path = typer.Option(
        ..., "--model-prefix", "-o", help="Output prefix: writes PREFIX.model and PREFIX.vocab."
    ),
    vocab_size: int = typer.Option(8000, min=8, help="Number of pieces, special symbols included."),
    model_type: str = typer.Option("unigram", help="unigram or bpe."),
    character_coverage: float = typer.Option(1.0, help="Share of characters covered (0.9995 for large alphabets)."),
    input_sentence_size: int = typer.Option(2_000_000, min=0, help="Sentences sampled for training (0 = all)."),
) -> None:
    """Train a sentencepiece model (pad=0, unk=1, bos=2, eos=3)."""
    from transformer_mt.text import train_sentencepiece

    path = train_sentencepiece(
        inputs,
        model_prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size,
    )
    typer.echo(f"wrote {path} ({vocab_size} pieces, {model_type})", err=True)


@tokenize_app.command("encode")
def tokenize_encode(
    model: Path = typer.Option(..., "--model", "-m", help="Sentencepiece .model file."),
    input: Path | None = typer.Argument(None, help="Text file (default: stdin)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output file (default: stdout), replaced only on success."
    ),
    ids: bool = typer.Option(False, "--ids", help="Write ids instead of pieces."),
) -> None:
    """Encode text into space-separated pieces (or ids), one line per input line."""
    from transformer_mt.text import Tokenizer, encode_stream

    tok = Tokenizer(model)
    lines = input_lines(input)
    with safe_output(output, inputs=[input, model]) as out:  # written to a temporary file, renamed on success
        n = encode_stream(tok, progress(lines, input), out, as_ids=ids)
        out.flush()
    if output is not None and str(output) != "-":
        typer.echo(f"encoded {n} lines into {output}", err=True)


@tokenize_app.command("decode")
def tokenize_decode(
    model: Path = typer.Option(..., "--model", "-m", help="Sentencepiece .model file."),
    input: Path | None = typer.Argument(None, help="File of pieces or ids (default: stdin)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output file (default: stdout), replaced only on success."
    ),
    ids: bool = typer.Option(False, "--ids", help="Input holds ids instead of pieces."),
) -> None:
    """Decode pieces (or ids) back into text, one line per input line."""
    from transformer_mt.text import Tokenizer, decode_stream

    tok = Tokenizer(model)
    lines = input_lines(input)
    with safe_output(output, inputs=[input, model]) as out:
        decode_stream(
            tok,
            progress(lines, input),
            out,
            as_ids=ids,
            source="<stdin>" if input is None or str(input) == "-" else str(input),
        )
        out.flush()
