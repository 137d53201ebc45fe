"""tmt against transformers on one MarianMT model: agreement and decoding speed.

    python scripts/hf_compare.py MODEL_DIR --src test.en [--ref test.de] [-n 500] [--threads 4] [--json out.json]

MODEL_DIR is a MarianMT directory as save_pretrained writes it (an OPUS-MT model from the Hub, or `tmt export
--format marian-hf`'s output); it is imported with `tmt import --from marian-hf` into a temporary checkpoint. On the
first N lines of --src it reports:

- max |log-prob difference| of teacher forcing, tmt against MarianMTModel, over every target position of --ref
  (without --ref: of transformers' own greedy outputs);
- lines identical, greedy and beam 4, tmt's Translator against generate(), both searches set to be the same search:
  length penalty 0 (transformers' len**lp and tmt's GNMT ((5+len)/6)**alpha are both the plain sum there),
  early_stopping=False, one length limit (max_new_tokens = --max-len, tmt max_len_a 0, max_len_b --max-len), no
  forced EOS, the pad id never generated, no renormalisation;
- decoding speed, sentences per second, beam 4, the same lines, one run each (tmt: batches of --batch-tokens
  source tokens, longest first; transformers: batches of --batch-size lines in the same order).

Timings mean something only on a quiet machine: run it alone, with --threads set.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_mt.decoding import Translator, translate_ids
from transformer_mt.hf import import_marian, require_transformers
from transformer_mt.text import iter_file


def _generate(hf, tok, lines: list[str], *, beam: int, max_len: int, batch_size: int) -> list[list[int]]:
    """generate()'s best output per line: generated ids without the start and after the first EOS."""
    eos, out = hf.config.eos_token_id, []
    for i in range(0, len(lines), batch_size):
        batch = tok(lines[i : i + batch_size], return_tensors="pt", padding=True)
        with torch.inference_mode():
            gen = hf.generate(
                **batch,
                num_beams=beam,
                length_penalty=0.0,
                early_stopping=False,
                max_new_tokens=max_len,
                do_sample=False,
                forced_eos_token_id=None,
                bad_words_ids=[[hf.config.pad_token_id]],
                renormalize_logits=False,
            )
        out += [row[: row.index(eos)] if eos in row else row for row in gen[:, 1:].tolist()]
    return out


def max_logprob_difference(
    hf, tok, tr: Translator, lines: list[str], targets: list[list[int]], *, batch_size: int
) -> float:
    """Teacher forcing of ``targets`` (target ids without EOS) in both: the largest
    |log p_tmt - log p_hf| at a real position."""
    eos, pad, start = hf.config.eos_token_id, hf.config.pad_token_id, hf.config.decoder_start_token_id
    worst = 0.0
    for i in range(0, len(lines), batch_size):
        batch = tok(lines[i : i + batch_size], return_tensors="pt", padding=True)
        rows = [t + [eos] for t in targets[i : i + batch_size]]
        labels = torch.full((len(rows), max(map(len, rows))), pad)  # (B, T) target + EOS, right-padded
        for r, row in enumerate(rows):
            labels[r, : len(row)] = torch.tensor(row)
        tgt_in = torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], dim=1)  # (B, T) start + target
        real = torch.zeros_like(labels, dtype=torch.bool)
        for r, row in enumerate(rows):
            real[r, : len(row)] = True
        with torch.inference_mode():
            theirs = hf(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in
            ).logits.log_softmax(-1)
            ours = tr.model.decode(tgt_in, tr.model.encode(batch["input_ids"])).log_softmax(-1)
        worst = max(worst, (ours - theirs)[real].abs().max().item())
    return worst


def compare(
    model_dir: Path, lines: list[str], refs: list[str] | None, *, max_len: int, batch_size: int, batch_tokens: int
) -> dict:
    transformers = require_transformers()
    hf = transformers.MarianMTModel.from_pretrained(model_dir).eval()
    tok = transformers.MarianTokenizer.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Translator.from_checkpoint(import_marian(model_dir, Path(tmp) / "model.pt"), device="cpu")
    src_ids = tr.src_tok.encode(lines)
    report: dict = {
        "model": str(model_dir),
        "lines": len(lines),
        "max_len": max_len,
        "threads": torch.get_num_threads(),
    }
    for beam in (1, 4):
        start = time.perf_counter()
        ours = [
            h[0].tokens
            for h in translate_ids(
                tr.model, src_ids, beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=max_len, batch_tokens=batch_tokens
            )
        ]
        tmt_s = time.perf_counter() - start
        # the same order for transformers: longest source first, as tmt batches them
        order = sorted(range(len(lines)), key=lambda i: len(src_ids[i]), reverse=True)
        start = time.perf_counter()
        sorted_out = _generate(hf, tok, [lines[i] for i in order], beam=beam, max_len=max_len, batch_size=batch_size)
        hf_s = time.perf_counter() - start
        theirs: list[list[int]] = [[] for _ in lines]
        for i, out in zip(order, sorted_out):
            theirs[i] = out
        name = "greedy" if beam == 1 else f"beam{beam}"
        report[f"{name}_identical"] = sum(a == b for a, b in zip(ours, theirs))
        if beam == 4:
            report["tmt_sentences_per_s"] = len(lines) / tmt_s
            report["transformers_sentences_per_s"] = len(lines) / hf_s
        if beam == 1 and refs is None:
            greedy = theirs
    targets = tr.tgt_tok.encode(refs) if refs is not None else greedy
    report["teacher_forced_on"] = "--ref" if refs is not None else "transformers' greedy outputs"
    report["max_abs_logprob_diff"] = max_logprob_difference(hf, tok, tr, lines, targets, batch_size=batch_size)
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--ref", type=Path)
    ap.add_argument("-n", type=int, default=500, help="lines of --src (and --ref) to use")
    ap.add_argument("--max-len", type=int, default=256, help="longest output of both searches")
    ap.add_argument("--batch-size", type=int, default=32, help="lines per generate() call")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="source tokens per tmt batch")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = [line for _, line in zip(range(args.n), iter_file(args.src))]
    refs = [line for _, line in zip(range(len(lines)), iter_file(args.ref))] if args.ref else None
    report = compare(
        args.model_dir, lines, refs, max_len=args.max_len, batch_size=args.batch_size, batch_tokens=args.batch_tokens
    )
    for key, value in report.items():
        print(f"{key}: {value:.3g}" if isinstance(value, float) else f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
