#!/usr/bin/env python
"""BLEU in the convention of the published Multi30k papers, to put a score beside theirs.

    python scripts/published_bleu.py --ref data/multi30k/test_2016_flickr.de HYP [HYP ...] [--lang de] [--json]

The Multi30k repository's tokenised files (github.com/multi30k/dataset, scripts/task1-tokenize.sh)
are made with the Moses scripts ``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl
-l L``, and the papers score hypotheses in that form with multi-bleu.perl or fairseq-generate's BLEU
(whitespace tokens, nothing split further). This script applies the same three steps, through
sacremoses (the Python port of those Moses scripts), to the reference and to each detokenized
hypothesis file, and scores the result with sacreBLEU's BLEU and ``tokenize="none"``.

A check that the convention is reproduced: the published Transformer-Tiny log reports
``reflen=12103`` on test_2016_flickr (en-de), the token count this script prints for that reference.

Needs ``pip install sacremoses``. It is not a dependency of transformer_mt: ``tmt bleu`` (sacreBLEU on
detokenized text) is the project's metric; this script only answers "how does that compare with
the number in a Multi30k paper".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from transformer_mt.errors import TmtError
from transformer_mt.evaluation import read_lines, score


def moses_pipeline(lang: str):
    """lines -> lines as lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        sys.exit(
            "published_bleu.py: needs the sacremoses package (the Moses tokenizer in Python); "
            "run: pip install sacremoses"
        )
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def apply(lines: list[str]) -> list[str]:
        # tokenizer.perl escapes by default (' -> &apos;). Escaping rewrites characters inside tokens,
        # one to one, so it changes no score; it is kept so the text matches the repository's files.
        return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True) for line in lines]

    return apply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hyps", nargs="+", help="detokenized hypothesis files (tmt translate / evaluate output)")
    parser.add_argument(
        "--ref", required=True, help="the detokenized reference file (e.g. data/multi30k/test_2016_flickr.de)"
    )
    parser.add_argument(
        "--lang",
        default=None,
        help="Moses language code of the target (default: the reference's two-letter extension, e.g. de)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per hypothesis file")
    args = parser.parse_args(argv)
    lang = args.lang or Path(args.ref).suffix.lstrip(".")
    if not args.lang and not (lang.isalpha() and len(lang) == 2):  # "ref.txt" is no language code: ask
        sys.exit(f"published_bleu.py: cannot tell the target language from '{args.ref}'; pass --lang (e.g. --lang de)")
    prepare = moses_pipeline(lang)
    try:
        ref = prepare(read_lines(args.ref))
        print(
            f"{args.ref}: {sum(len(line.split()) for line in ref)} reference tokens "
            f"after lowercase | normalize | tokenize -l {lang}",
            file=sys.stderr,
        )
        for hyp_path in args.hyps:
            hyp = prepare(read_lines(hyp_path))
            bleu = score(hyp, [ref], metrics=("bleu",), tokenize="none", hyp_name=hyp_path, ref_names=[args.ref])[
                "bleu"
            ]
            if args.json:
                print(
                    json.dumps(
                        {
                            "file": hyp_path,
                            "bleu": round(bleu["score"], 2),
                            "verbose": bleu["verbose"],
                            "convention": f"moses-lc-norm-tok-{lang}",
                        }
                    )
                )
            else:
                print(
                    f"{hyp_path}: BLEU {bleu['score']:.2f} {bleu['verbose']} "
                    f"(lowercased, Moses-normalized and -tokenized, {lang})"
                )
    except TmtError as exc:  # MetricsError, or textio's TextError for a file that is not UTF-8
        sys.exit(f"published_bleu.py: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
