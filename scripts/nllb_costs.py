"""What an NLLB-shaped model costs in tmt on this machine: import time, decoding speed beside transformers'
generate(), and the memory of a full, a LoRA and a frozen fine-tuning step.

    python scripts/nllb_costs.py --shape 600m [--vocab 8000] [-n 16] [--threads 2] [--json out.json] [--work DIR]

No NLLB weights can be downloaded where this runs, so the model is random: transformers builds an
``M2M100ForConditionalGeneration`` with NLLB-200's layers (``--shape 600m``: 12+12 layers, d_model 1024, 16 heads,
d_ff 4096; ``1.3b``: 24+24 layers, d_ff 8192) and saves it with an ``NllbTokenizer`` over a BPE sentencepiece model of
``--vocab`` pieces trained on Multi30k (NLLB's own 256,206-piece vocabulary cannot be rebuilt without its model; the
embedding rows are the only difference, d_model x pieces parameters, and the report states the count). Then, one
after the other, on the first ``-n`` English sentences of Multi30k's test_2016_flickr:

- ``import``: seconds of ``tmt import --from m2m100-hf`` (``import_m2m100``), the safetensors read and checked;
- ``decode``: sentences/s of tmt's Translator and of ``generate()``, beam 4, length penalty 0, ``eng_Latn`` ->
  ``deu_Latn`` (the code forced after the decoder's start), at most ``--max-len`` pieces, the same lines in the same
  run (a random model rarely ends a sentence, so both run to the limit: the figures compare the searches' cost per
  step), and how many lines are identical;
- ``memory``: for each of full fine-tuning, LoRA (r 16 on q,v; and on all six projections) and frozen embeddings +
  encoder, in a fresh process: the bytes of weights, gradients and Adam states after one update of tmt's optimizer
  (counted tensor by tensor) and the process's peak resident memory (the batch's activations and torch included),
  on one batch of ``--batch-tokens`` real Multi30k pairs.

Timings mean something only on a quiet machine: run it alone.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "600m": {"layers": 12, "ffn": 4096},
    "1.3b": {"layers": 24, "ffn": 8192},
}
LANGS = ["eng_Latn", "deu_Latn", "fra_Latn"]
MODES = {
    "full": {},
    "lora-qv": {"lora": {"rank": 16, "alpha": 32, "targets": ["q", "v"]}},
    "lora-all": {"lora": {"rank": 16, "alpha": 32, "targets": ["q", "k", "v", "o", "ffn1", "ffn2"]}},
    "frozen": {"freeze": {"embeddings": True, "encoder": True}},
}


def _lines(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [line.strip() for _, line in zip(range(n), handle)]


def build_model(directory: Path, data: Path, shape: str, vocab: int) -> float:
    """A random NLLB-shaped model and its tokenizer saved in ``directory``; returns the seconds it took."""
    import sentencepiece as spm
    import torch
    import transformers

    tic = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    lines = [line for lang in ("en", "de", "fr") for line in _lines(data / f"train.{lang}", 29000)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab, model_type="bpe", minloglevel=2
    )
    (directory / "sentencepiece.bpe.model").write_bytes(out.getvalue())
    tok = transformers.NllbTokenizer.from_pretrained(str(directory), additional_special_tokens=LANGS)
    tok.save_pretrained(str(directory))
    s = SHAPES[shape]
    config = transformers.M2M100Config(
        vocab_size=len(tok),
        d_model=1024,
        encoder_layers=s["layers"],
        decoder_layers=s["layers"],
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"],
        max_position_embeddings=1024,
        dropout=0.1,
        scale_embedding=True,
    )
    torch.manual_seed(0)
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    model.save_pretrained(str(directory))
    return time.perf_counter() - tic


def decode_both(checkpoint: Path, directory: Path, lines: list[str], *, beam: int, max_len: int) -> dict:
    """tmt's Translator and transformers' generate() on the same lines: sentences/s each and lines identical."""
    import torch
    import transformers

    from transformer_mt.decoding import Translator

    tr = Translator.from_checkpoint(checkpoint, device="cpu")
    src_prefix = tr.src_tok.tag_ids(["eng_Latn"], where="nllb_costs")
    tgt_prefix = tr.tgt_tok.tag_ids(["deu_Latn"], where="nllb_costs")
    tic = time.perf_counter()
    ours = tr.translate_batch(
        lines, beam=beam, lenpen=0.0, max_len_a=0.0, max_len_b=max_len, src_prefix=src_prefix, tgt_prefix=tgt_prefix
    )
    tmt_s = time.perf_counter() - tic
    del tr
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(directory)).eval()
    tok = transformers.NllbTokenizer.from_pretrained(str(directory))
    tok.src_lang = "eng_Latn"
    code = tok.convert_tokens_to_ids("deu_Latn")
    tic = time.perf_counter()
    theirs = []
    for i in range(0, len(lines), 16):
        batch = tok(lines[i : i + 16], return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = hf.generate(
                **batch,
                num_beams=beam,
                do_sample=False,
                length_penalty=0.0,
                early_stopping=False,
                forced_bos_token_id=code,
                max_new_tokens=max_len + 1,
                suppress_tokens=[0, 1],
            )
        theirs += tok.batch_decode(out, skip_special_tokens=True)
    hf_s = time.perf_counter() - tic
    same = sum(nb[0][1] == text for nb, text in zip(ours.hypotheses, theirs))
    return {
        "lines": len(lines),
        "tmt_sentences_per_s": len(lines) / tmt_s,
        "generate_sentences_per_s": len(lines) / hf_s,
        "tmt_s": tmt_s,
        "generate_s": hf_s,
        "identical": same,
    }


def memory_step(checkpoint: Path, data: Path, mode: str, batch_tokens: int) -> dict:
    """One update of ``mode`` (MODES) on a batch of real pairs: the bytes of weights, gradients and Adam states, and
    the process's peak resident memory."""
    import dataclasses

    import torch

    from transformer_mt.config import FreezeConfig, LoraConfig, TrainConfig
    from transformer_mt.data import collate
    from transformer_mt.decoding import model_from_checkpoint
    from transformer_mt.model import TeacherForcedLoss
    from transformer_mt.training import build_optimizer, prepare_for_training

    loaded = model_from_checkpoint(checkpoint)
    model, tok = loaded.model, loaded.src_tok
    spec = MODES[mode]
    t = dataclasses.replace(
        TrainConfig(),
        lora=LoraConfig(**spec.get("lora", {})),
        freeze=FreezeConfig(**spec.get("freeze", {})),
    )
    prepare_for_training(model, t)
    model.train()
    optimizer = build_optimizer(model, t)
    eng, deu = tok.tag_ids(["eng_Latn"], where="nllb_costs"), tok.tag_ids(["deu_Latn"], where="nllb_costs")
    src, tgt = (tok.encode(_lines(data / f"train.{lang}", 400)) for lang in ("en", "de"))
    pairs, used = [], 0
    for s, t_ids in zip(src, tgt):
        cost = max(len(s), len(t_ids)) + 2
        if used + cost > batch_tokens:
            break
        pairs.append((eng + s, deu + t_ids))
        used += cost
    batch = collate(pairs, specials=tok.specials)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loss_sum, _, ntokens = TeacherForcedLoss(model, label_smoothing=0.1)(batch.src, batch.tgt_in, batch.tgt_out)
    (loss_sum / ntokens).backward()
    optimizer.step()
    params = list(model.parameters())
    held = sum(p.nbytes for p in params) + sum(p.grad.nbytes for p in params if p.grad is not None)
    held += sum(v.nbytes for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return {
        "mode": mode,
        "trained": sum(p.numel() for p in params if p.requires_grad),
        "parameters": sum(p.numel() for p in params),
        "state_bytes": held,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_before_step_bytes": rss_before * 1024,
        "batch_pairs": len(pairs),
        "batch_target_tokens": int(ntokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="600m")
    parser.add_argument("--vocab", type=int, default=8000, help="sentencepiece pieces (the codes and <mask> add 4)")
    parser.add_argument("-n", type=int, default=16, help="test sentences decoded by each")
    parser.add_argument("--max-len", type=int, default=24, help="pieces generated at most after the language code")
    parser.add_argument("--batch-tokens", type=int, default=1024, help="the fine-tuning step's batch, in tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("TMT_MULTI30K", "../shared/data/multi30k")))
    parser.add_argument("--work", type=Path, default=None, help="where the model goes (default: a temporary folder)")
    parser.add_argument("--modes", default=",".join(MODES), help="memory steps to measure, comma-separated")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--step", default=None, help=argparse.SUPPRESS)  # internal: one memory step, JSON out
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.step:
        checkpoint, mode = args.step.split("::")
        print(json.dumps(memory_step(Path(checkpoint), args.data, mode, args.batch_tokens)))
        return
    from transformer_mt.hf.m2m100_importer import import_m2m100

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        directory, checkpoint = work / f"nllb-{args.shape}", work / f"nllb-{args.shape}.pt"
        report: dict = {"shape": args.shape, "threads": args.threads, "torch": torch.__version__}
        if not (directory / "config.json").is_file():
            report["build_s"] = build_model(directory, args.data, args.shape, args.vocab)
        tic = time.perf_counter()
        import_m2m100(directory, checkpoint, force=True)
        report["import_s"] = time.perf_counter() - tic
        report["checkpoint_bytes"] = checkpoint.stat().st_size
        print(json.dumps(report), flush=True)
        lines = _lines(args.data / "test_2016_flickr.en", args.n)
        report["decode"] = decode_both(checkpoint, directory, lines, beam=4, max_len=args.max_len)
        print(json.dumps(report["decode"]), flush=True)
        report["memory"] = []
        for mode in args.modes.split(","):
            cmd = [sys.executable, __file__, "--step", f"{checkpoint}::{mode}", "--data", str(args.data)]
            cmd += ["--threads", str(args.threads), "--batch-tokens", str(args.batch_tokens)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                report["memory"].append({"mode": mode, "error": done.stderr.strip().splitlines()[-1:]})
            else:
                report["memory"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(report["memory"][-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    _print_table(report)


def _print_table(report: dict) -> None:
    d = report["decode"]
    print(
        f"\nNLLB-{report['shape']} layers, random, torch {report['torch']}, {report['threads']} threads: import "
        f"{report['import_s']:.1f} s ({report['checkpoint_bytes'] / 1e9:.2f} GB); beam 4 on {d['lines']} lines: "
        f"tmt {d['tmt_sentences_per_s']:.2f} sentences/s, generate() {d['generate_sentences_per_s']:.2f} "
        f"({d['identical']} of {d['lines']} identical)\n"
    )
    print("| step | trained parameters | of | weights + gradients + Adam | peak RSS |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for m in report["memory"]:
        if "error" in m:
            print(f"| {m['mode']} | failed: {m['error']} | | | |")
            continue
        print(
            f"| {m['mode']} | {m['trained']:,} | {m['parameters']:,} | {m['state_bytes'] / 1e9:.2f} GB | "
            f"{m['peak_rss_bytes'] / 1e9:.2f} GB |"
        )


if __name__ == "__main__":
    main()
