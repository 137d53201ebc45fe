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
    device: Optional[str] = typer.Option(None, "--device", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps; same as --set train.device=..."),
) -> None:
    """Train a model with teacher forcing (writes checkpoints, logs and metrics to train.out_dir)."""
    from transformer_mt.train import train_from_cli

    overrides = list(set_) + ([f"train.device={device}"] if device else [])
    train_from_cli(config=config, overrides=overrides, resume=resume)


@app.command()
def preprocess(
    config: Path = typer.Option(..., "--config", "-c", help="YAML config, the one `tmt train` will use."),
    set_: List[str] = typer.Option([], "--set", "-s", help="Override one value: section.key=value (repeatable)."),
) -> None:
    """Encode the corpora once into the memory-mapped cache `tmt train` reads (for large corpora and multi-GPU runs)."""
    from transformer_mt.config import load_config
    from transformer_mt.prepare import preprocess as preprocess_corpora

    for data in preprocess_corpora(load_config(config, set_), log=lambda msg: typer.echo(msg, err=True)):
        if data is not None:
            typer.echo(data.summary.format())


# ---------------------------------------------------------------- translate / evaluate
_CKPT_HELP = ("A checkpoint written by `tmt train` or `tmt average`; repeat -c to decode an ensemble "
              "(mean of the models' probabilities; they must share the tokenizer).")
_BEAM_HELP = "Beam size (1 = greedy). Default: the checkpoint's decode.beam."
_LENPEN_HELP = "GNMT length penalty alpha, ((5+len)/6)^alpha. Default: decode.lenpen."


@app.command()
def translate(
    checkpoints: List[Path] = typer.Option(..., "--checkpoint", "-c", help=_CKPT_HELP),
    input: Optional[Path] = typer.Argument(None, help="Source text file (default: stdin, translated as lines arrive)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Output file (default: stdout)."),
    beam: Optional[int] = typer.Option(None, "--beam", "-b", help=_BEAM_HELP),
    lenpen: Optional[float] = typer.Option(None, "--lenpen", help=_LENPEN_HELP),
    nbest: int = typer.Option(1, "--nbest", help="Hypotheses per input; >1 prints INDEX<TAB>SCORE<TAB>TEXT lines."),
    batch_tokens: Optional[int] = typer.Option(None, "--batch-tokens", help="Source tokens per batch. Default: decode.batch_tokens."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16 (GPU)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads (0 = torch default)."),
) -> None:
    """Translate raw text with greedy or beam search: one output line per input line."""
    from transformer_mt.translate import Translator, count_lines, file_chunks, stdin_chunks, translate_stream

    tr = Translator.from_checkpoints(checkpoints, device=device, dtype=dtype, threads=threads)
    beam, lenpen = _decode_args(tr, beam, lenpen, nbest)
    chunks = file_chunks(input) if input is not None and str(input) != "-" else stdin_chunks()
    bar = None
    if input is not None and str(input) != "-" and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=count_lines(input), unit=" lines", desc="translate", leave=False)
    out = _open_out(output)
    try:
        translate_stream(tr, chunks, out, beam=beam, lenpen=lenpen, nbest=nbest, batch_tokens=batch_tokens, progress=bar)
    finally:
        if bar is not None:
            bar.close()
        if out is not sys.stdout:
            out.close()
    if tr.warning():
        typer.echo(tr.warning(), err=True)


def _decode_args(tr, beam: Optional[int], lenpen: Optional[float], nbest: int) -> tuple[int, float]:
    from transformer_mt.translate import TranslateError

    beam = tr.cfg.decode.beam if beam is None else beam
    lenpen = tr.cfg.decode.lenpen if lenpen is None else lenpen
    if beam < 1 or not 1 <= nbest <= beam:
        raise TranslateError(f"--beam {beam} --nbest {nbest}: need beam >= 1 and 1 <= nbest <= beam")
    return beam, lenpen


@app.command()
def evaluate(
    checkpoints: List[Path] = typer.Option(..., "--checkpoint", "-c", help=_CKPT_HELP),
    src: Path = typer.Option(..., "--src", help="Source text file."),
    ref: List[Path] = typer.Option(..., "--ref", help="Reference file (repeat for several references)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write the hypotheses (default: SRC name + .hyp next to the checkpoint)."),
    beam: Optional[int] = typer.Option(None, "--beam", "-b", help=_BEAM_HELP),
    lenpen: Optional[float] = typer.Option(None, "--lenpen", help=_LENPEN_HELP),
    batch_tokens: Optional[int] = typer.Option(None, "--batch-tokens", help="Source tokens per batch."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16 (GPU)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads (0 = torch default)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of text."),
) -> None:
    """Translate SRC, write the hypotheses, print BLEU, chrF, sentences/s and target tokens/s."""
    import json

    from transformer_mt.metrics import read_lines, score
    from transformer_mt.translate import Translator, file_chunks, translate_stream

    refs = [read_lines(r) for r in ref]  # read first: a bad reference fails before the long part
    tr = Translator.from_checkpoints(checkpoints, device=device, dtype=dtype, threads=threads)
    beam, lenpen = _decode_args(tr, beam, lenpen, 1)
    output = output or checkpoints[0].parent / f"{src.name}.{checkpoints[0].stem}.hyp"
    with open(output, "w", encoding="utf-8") as out:
        stats = translate_stream(tr, file_chunks(src), out, beam=beam, lenpen=lenpen, batch_tokens=batch_tokens)
    results = score(read_lines(output), refs, metrics=("bleu", "chrf"), lowercase=lowercase, hyp_name=str(output), ref_names=[str(r) for r in ref])
    report = {"bleu": round(results["bleu"]["score"], 2), "chrf": round(results["chrf"]["score"], 2),
              "sentences_per_s": round(stats.lines / stats.seconds, 2), "tgt_tokens_per_s": round(stats.tgt_tokens / stats.seconds, 1),
              "seconds": round(stats.seconds, 2), "beam": beam, "lenpen": lenpen, "hypotheses": str(output),
              "bleu_signature": results["bleu"]["signature"], "chrf_signature": results["chrf"]["signature"]}
    if tr.warning():
        typer.echo(tr.warning(), err=True)
    if json_out:
        typer.echo(json.dumps(report))
        return
    typer.echo(results["bleu"]["text"])
    typer.echo(results["chrf"]["text"])
    typer.echo(f"{stats.lines} sentences in {stats.seconds:.1f} s: {report['sentences_per_s']} sentences/s, "
               f"{report['tgt_tokens_per_s']} target tokens/s (beam {beam}, lenpen {lenpen}); hypotheses in {output}")


# ---------------------------------------------------------------- bleu / average
@app.command()
def bleu(
    ref: List[Path] = typer.Option(..., "--ref", "-r", help="Reference file (repeat for several references)."),
    hyp: Optional[Path] = typer.Argument(None, help="Hypothesis file (default: stdin)."),
    lowercase: bool = typer.Option(False, "--lowercase", "-lc", help="Case-insensitive BLEU and chrF."),
    tokenize: Optional[str] = typer.Option(None, "--tokenize", "-tok", help="BLEU tokenizer (sacreBLEU's; default 13a)."),
    ter: bool = typer.Option(False, "--ter", help="Also compute TER."),
    json_out: bool = typer.Option(False, "--json", help="sacreBLEU's JSON output."),
    width: int = typer.Option(1, "--width", "-w", help="Decimals to print."),
) -> None:
    """Corpus BLEU and chrF (and TER) with sacreBLEU, signature included."""
    from transformer_mt.metrics import MetricsError, format_json, format_text, read_lines, score

    if hyp is None or str(hyp) == "-":
        hyps, hyp_name = [line.rstrip() for line in sys.stdin.read().split("\n")], "<stdin>"
        if hyps and hyps[-1] == "":
            hyps.pop()
    else:
        hyps, hyp_name = read_lines(hyp), str(hyp)
    if not ref:
        raise MetricsError("give at least one --ref file")
    results = score(hyps, [read_lines(r) for r in ref], metrics=("bleu", "chrf"), lowercase=lowercase, tokenize=tokenize,
                    ter=ter, hyp_name=hyp_name, ref_names=[str(r) for r in ref])
    typer.echo(format_json(results, width=width) if json_out else format_text(results, width=width))


@app.command()
def average(
    checkpoints: List[Path] = typer.Argument(None, help="Checkpoint files to average (or give --run and --last)."),
    run: Optional[Path] = typer.Option(None, "--run", help="Run directory: average its newest numbered checkpoints."),
    last: int = typer.Option(5, "--last", help="With --run: how many of the newest checkpoints."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
) -> None:
    """Average model parameters of several checkpoints (the paper averages the last 5 or 20)."""
    from transformer_mt.checkpoint import CheckpointError, average_checkpoints, last_checkpoints, save_checkpoint

    paths = list(checkpoints or [])
    if run is not None:
        paths += last_checkpoints(run, last)
    if len(paths) < 2:
        raise CheckpointError("give at least two checkpoints, or --run RUN_DIR --last N")
    save_checkpoint(average_checkpoints(paths), output)
    typer.echo(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {output}", err=True)


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
