"""The `tmt` command line: thin Typer commands that parse, call one library function, print.

User mistakes (a missing file, an unknown config key, mismatched line counts...) are raised
by the library as its own error classes and printed here as one line, never a traceback.
Heavy imports (torch) happen inside the commands so `tmt --help` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from transformer_mt import __version__

app = typer.Typer(
    name="tmt",
    help="transformer_mt: train and run Transformer machine-translation models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
tokenize_app = typer.Typer(help="Train a sentencepiece model; encode or decode text with it.", no_args_is_help=True)
app.add_typer(tokenize_app, name="tokenize")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """transformer_mt: train and run Transformer machine-translation models."""


def _open_in(path: Optional[Path]):
    if path is None or str(path) == "-":
        return sys.stdin
    if not path.is_file():
        raise FileNotFoundError(f"{path}: input file not found; check the path")
    return open(path, encoding="utf-8")


def _open_out(path: Optional[Path]):
    if path is None or str(path) == "-":
        return sys.stdout
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "w", encoding="utf-8")


# ---------------------------------------------------------------- tokenize
@tokenize_app.command("train")
def tokenize_train(
    inputs: List[Path] = typer.Option(..., "--input", "-i", help="Text file to learn from; repeat for source and target to get a joint vocabulary."),
    model_prefix: Path = typer.Option(..., "--model-prefix", "-o", help="Output prefix: writes PREFIX.model and PREFIX.vocab."),
    vocab_size: int = typer.Option(8000, help="Number of pieces, special symbols included."),
    model_type: str = typer.Option("unigram", help="unigram or bpe."),
    character_coverage: float = typer.Option(1.0, help="Share of characters covered (0.9995 for large alphabets)."),
    input_sentence_size: int = typer.Option(2_000_000, help="Sentences sampled for training (0 = all)."),
) -> None:
    """Train a sentencepiece model (pad=0, unk=1, bos=2, eos=3)."""
    from transformer_mt.tokenizer import train_sentencepiece

    path = train_sentencepiece(
        inputs, model_prefix, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, input_sentence_size=input_sentence_size,
    )
    typer.echo(f"wrote {path} ({vocab_size} pieces, {model_type})", err=True)


@tokenize_app.command("encode")
def tokenize_encode(
    model: Path = typer.Option(..., "--model", "-m", help="Sentencepiece .model file."),
    input: Optional[Path] = typer.Argument(None, help="Text file (default: stdin)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output file (default: stdout)."),
    ids: bool = typer.Option(False, "--ids", help="Write ids instead of pieces."),
) -> None:
    """Encode text into space-separated pieces (or ids), one line per input line."""
    from transformer_mt.tokenizer import Tokenizer, encode_stream

    tok = Tokenizer(model)
    src, out = _open_in(input), _open_out(output)
    n = encode_stream(tok, _progress(src, input), out, as_ids=ids)
    out.flush()
    if output is not None:
        typer.echo(f"encoded {n} lines into {output}", err=True)


@tokenize_app.command("decode")
def tokenize_decode(
    model: Path = typer.Option(..., "--model", "-m", help="Sentencepiece .model file."),
    input: Optional[Path] = typer.Argument(None, help="File of pieces or ids (default: stdin)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output file (default: stdout)."),
    ids: bool = typer.Option(False, "--ids", help="Input holds ids instead of pieces."),
) -> None:
    """Decode pieces (or ids) back into text, one line per input line."""
    from transformer_mt.tokenizer import Tokenizer, decode_stream

    tok = Tokenizer(model)
    src, out = _open_in(input), _open_out(output)
    decode_stream(tok, _progress(src, input), out, as_ids=ids, source=str(input or "<stdin>"))
    out.flush()


def _progress(handle, path: Optional[Path]):
    """A tqdm bar on stderr for files (by bytes would need binary reads; lines suffice)."""
    if path is None or str(path) == "-" or not sys.stderr.isatty():
        return handle
    from tqdm import tqdm

    return tqdm(handle, desc=f"{path.name}", unit=" lines", leave=False)


# ---------------------------------------------------------------- train
@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (see configs/)."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one value: section.key=value (repeatable)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Run directory to continue exactly where it stopped."),
) -> None:
    """Train a model with teacher forcing (writes checkpoints, logs and metrics to train.out_dir)."""
    from transformer_mt.train import train_from_cli

    train_from_cli(config=config, overrides=set_, resume=resume)


# ---------------------------------------------------------------- helpers for the rest
def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point: runs the app and turns user errors into one line on stderr."""
    try:
        app(args=argv, prog_name="tmt")
    except KeyboardInterrupt:
        typer.echo("tmt: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - only user errors are caught, others re-raised
        if not _is_user_error(exc):
            raise
        typer.echo(f"tmt: error: {exc}", err=True)
        sys.exit(2)


def _is_user_error(exc: BaseException) -> bool:
    """Our own *Error classes (ConfigError, DataError, ...) and plain file errors are worded for users."""
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError)):
        return True
    return any(c.__module__.startswith("transformer_mt.") and c.__name__.endswith("Error") for c in type(exc).__mro__)


if __name__ == "__main__":
    main()
