"""`tmt evaluate`: translate a test set and score it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from transformer_mt.cli.app import app
from transformer_mt.cli.common import BEAM_HELP, CKPT_HELP, LENPEN_HELP, decode_args, safe_output


@app.command()
def evaluate(
    checkpoints: List[Path] = typer.Option(..., "--checkpoint", "-c", help=CKPT_HELP),
    src: Path = typer.Option(..., "--src", help="Source text file."),
    ref: List[Path] = typer.Option(..., "--ref", help="Reference file (repeat for several references)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Where to write the hypotheses (default: SRC name + .hyp next to the checkpoint)."),
    beam: Optional[int] = typer.Option(None, "--beam", "-b", help=BEAM_HELP),
    lenpen: Optional[float] = typer.Option(None, "--lenpen", help=LENPEN_HELP),
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
    from transformer_mt.textio import file_chunks
    from transformer_mt.translate import Translator, translate_stream

    refs = [read_lines(r) for r in ref]  # read first: a bad reference fails before the long part
    tr = Translator.from_checkpoints(checkpoints, device=device, dtype=dtype, threads=threads)
    beam, lenpen = decode_args(tr, beam, lenpen, 1)
    output = output or checkpoints[0].parent / f"{src.name}.{checkpoints[0].stem}.hyp"
    with safe_output(output, inputs=[src, *ref, *checkpoints]) as out:  # refuses -o equal to --src/--ref; renamed on success
        stats = translate_stream(tr, file_chunks(src), out, beam=beam, lenpen=lenpen, batch_tokens=batch_tokens)
    results = score(read_lines(output), refs, metrics=("bleu", "chrf"), lowercase=lowercase, hyp_name=str(output), ref_names=[str(r) for r in ref])
    report = {"bleu": round(results["bleu"]["score"], 2), "chrf": round(results["chrf"]["score"], 2),
              "sentences_per_s": round(stats.lines / stats.seconds, 2), "tgt_tokens_per_s": round(stats.tgt_tokens / stats.seconds, 1),
              "seconds": round(stats.seconds, 2), "beam": beam, "lenpen": lenpen, "hypotheses": str(output),
              "bleu_signature": results["bleu"]["signature"], "chrf_signature": results["chrf"]["signature"]}
    if stats.warning():
        typer.echo(stats.warning(), err=True)
    if json_out:
        typer.echo(json.dumps(report))
        return
    typer.echo(results["bleu"]["text"])
    typer.echo(results["chrf"]["text"])
    typer.echo(f"{stats.lines} sentences in {stats.seconds:.1f} s: {report['sentences_per_s']} sentences/s, "
               f"{report['tgt_tokens_per_s']} target tokens/s (beam {beam}, lenpen {lenpen}); hypotheses in {output}")
