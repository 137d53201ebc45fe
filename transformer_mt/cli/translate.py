"""`tmt translate`: raw text in, translations out."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.common import (
    BEAM_HELP,
    CKPT_HELP,
    COMPUTE_TYPE_HELP,
    ENGINE_HELP,
    LENPEN_HELP,
    SRC_LANG_HELP,
    TGT_LANG_HELP,
    WEIGHTS_HELP,
    build_translator,
    decode_args,
    safe_output,
)


@app.command()
def translate(
    checkpoints: list[Path] = typer.Option(..., "--checkpoint", "-c", help=CKPT_HELP),
    input: Path | None = typer.Argument(None, help="Source text file (default: stdin, translated as lines arrive)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Output file (default: stdout)."),
    beam: int | None = typer.Option(None, "--beam", "-b", help=BEAM_HELP),
    lenpen: float | None = typer.Option(None, "--lenpen", help=LENPEN_HELP),
    nbest: int = typer.Option(1, "--nbest", help="Hypotheses per input; >1 prints INDEX<TAB>SCORE<TAB>TEXT lines."),
    batch_tokens: int | None = typer.Option(
        None, "--batch-tokens", min=1, help="Source tokens per batch. Default: decode.batch_tokens."
    ),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16 (GPU)."),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU threads (0 = torch default)."),
    weights: str | None = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    engine: str = typer.Option("tmt", "--engine", help=ENGINE_HELP),
    compute_type: str | None = typer.Option(None, "--compute-type", help=COMPUTE_TYPE_HELP),
    tgt_lang: str | None = typer.Option(None, "--tgt-lang", help=TGT_LANG_HELP),
    src_lang: str | None = typer.Option(None, "--src-lang", help=SRC_LANG_HELP),
    sample: bool | None = typer.Option(
        None,
        "--sample/--no-sample",
        help="Draw every token from the model's distribution instead of searching (back-translation); --nbest N: "
        "N independent samples per line. Default: decode.sample.",
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", help="Sampling: divide the logits by it (above 0). Default: decode.temperature (1)."
    ),
    top_k: int | None = typer.Option(
        None, "--top-k", help="Sampling: only the k most probable tokens (0: all). Default: decode.top_k."
    ),
    top_p: float | None = typer.Option(
        None, "--top-p", help="Sampling: only the nucleus of probability p, in (0, 1] (1: all). Default: decode.top_p."
    ),
    epsilon: float | None = typer.Option(
        None, "--epsilon", help="Sampling: only tokens of probability >= epsilon (0: all). Default: decode.epsilon."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Sampling: with each line's number, seeds its samples. Default: decode.seed (0)."
    ),
) -> None:
    """Translate raw text with greedy or beam search, or sample translations (--sample): one output line per input
    line (with --nbest N, N lines)."""
    from transformer_mt.decoding import LanguageTranslator, TranslateError, sampling_request, translate_stream
    from transformer_mt.text import count_lines, file_chunks, stdin_chunks

    chunks = (
        file_chunks(input) if input is not None and str(input) != "-" else stdin_chunks()
    )  # a wrong path fails first
    tr = build_translator(
        checkpoints,
        engine=engine,
        device=device,
        dtype=dtype,
        threads=threads,
        weights=weights,
        compute_type=compute_type,
    )
    tr = LanguageTranslator(
        tr, tgt_lang, where=str(checkpoints[0]), option="--tgt-lang", src_lang=src_lang
    )  # refused before any input
    sampling = sampling_request(
        tr.cfg.decode,
        sample=sample,
        beam=beam,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        epsilon=epsilon,
        seed=seed,
        options=True,
    )
    if sampling is not None and nbest < 1:
        raise TranslateError(f"--nbest {nbest} is out of range; use 1 or more (the samples per line)")
    # sampling draws with a beam of 1 whatever decode.beam says; its --nbest samples are not bounded by a beam
    beam, lenpen = decode_args(tr, beam if sampling is None else 1, lenpen, nbest if sampling is None else 1)
    bar = None
    if (
        input is not None and str(input) != "-" and input.is_file() and sys.stderr.isatty()
    ):  # counting a pipe would consume it
        from tqdm import tqdm

        bar = tqdm(total=count_lines(input), unit=" lines", desc="translate", leave=False)
    try:
        with safe_output(output, inputs=[input, *checkpoints]) as out:  # -o: a temporary file renamed on success
            stats = translate_stream(
                tr,
                chunks,
                out,
                beam=beam,
                lenpen=lenpen,
                nbest=nbest,
                batch_tokens=batch_tokens,
                progress=bar,
                sampling=sampling,
            )
    finally:
        if bar is not None:
            bar.close()
    if stats.warning():
        typer.echo(stats.warning(), err=True)


@app.command()
def mbr(
    candidates: list[Path] = typer.Argument(
        ...,
        help="Candidate files, one per system, for the same inputs: "
        "tmt translate output, plain (one line per input) or n-best (--nbest K).",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Output file, one line per input (default: stdout)."
    ),
    weights: str = typer.Option(
        "uniform",
        "--weights",
        help="How a system shares its weight among its candidates for an input: "
        "uniform, or score (softmax of the n-best scores / --temperature). Every system weighs the same.",
    ),
    temperature: float = typer.Option(
        1.0, "--temperature", help="With --weights score: divides the scores before the softmax."
    ),
) -> None:
    """Minimum Bayes risk choice: per input, the candidate with the highest expected sentence BLEU against
    all pooled candidates (a consensus of n-best lists, checkpoints or systems)."""
    from transformer_mt.decoding import mbr_files

    choices = mbr_files(candidates, weights=weights, temperature=temperature)
    with safe_output(output, inputs=list(candidates)) as out:
        out.writelines(line + "\n" for line in choices)
