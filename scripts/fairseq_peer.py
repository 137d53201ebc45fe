"""fairseq beside tmt in one benchmark run (issue 22): ``scripts/benchmark.py --peer fairseq [--only peer]``.

The ratio the README quotes must come from one machine and one run, so the benchmark trains both toolkits on
the same config one after the other, each in its own process with the same threads:

  config     the issue's tmt command: configs/multi30k_reference.yaml with PEER_OVERRIDES (3+3 layers, d_model 256,
             d_ff 1024, 4 heads, post-norm, dropout 0.1, activation dropout 0.1 and attention dropout 0 from the
             YAML, shared embeddings, 4096-token batches, Adam (0.9, 0.98) eps 1e-9, inverse_sqrt peak 5e-4 after
             1000 warm-up updates, label smoothing 0.1, float32); :func:`train_command` maps every field that
             changes the work to fairseq's flag and refuses a field fairseq has no flag for.
  data       the very pairs tmt trains on (its encoded corpus, after its length filters) written as sentencepiece
             pieces, binarized by ``fairseq-preprocess --joined-dictionary`` with a dictionary built from the
             sentencepiece vocabulary in id order: fairseq's 4 specials take ids 0-3 as sentencepiece's own 4 do,
             so both sides have the same vocabulary size (checked from fairseq's log) and the same token counts.
             ``--required-batch-size-multiple 1`` makes fairseq's batches the greedy cut that tmt's are (sorted by
             length, a batch's size = its longest side x sentences <= max_tokens).
  timing     target tokens (non-pad, EOS included) per second over updates FIRST+1 .. LAST (``--peer-updates``,
             default 40 160): tmt by the benchmark's train phase (the window from the end of update FIRST to the end
             of update LAST); fairseq from its per-update JSON log (``--log-format json --log-interval 1``): the
             train_inner line of update u gives wpb_u (its target tokens) and wps_u (wpb_u over the wall time since
             the previous line: fairseq resets its meters after each line), so its time is wpb_u / wps_u and
             tokens/s = sum wpb_u / sum (wpb_u / wps_u). As a cross-check the parent also stamps each line as it
             arrives (``wall_tokens_per_s``: sum wpb_u over the time from line FIRST to line LAST).
             No validation and no checkpoint is written on either side (fairseq ``--disable-validation --no-save``).
  FLOPs      per target token as the benchmark measures them for tmt (FlopCounterMode on tmt's model and batches);
             the same count is applied to fairseq's tokens/s, the model and the batches being the same up to padding.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

from transformer_mt.config import Config, from_dict, load_config
from transformer_mt.data import load_corpora
from transformer_mt.errors import TmtError
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

REPO = Path(__file__).resolve().parents[1]
PEER_CONFIG = REPO / "configs" / "multi30k_reference.yaml"
PEER_OVERRIDES = (
    "model.norm=post",
    "model.dropout=0.1",
    "train.max_tokens=4096",
    "train.lr=5e-4",
    "train.warmup_updates=1000",
    "train.dtype=float32",
)  # issue 22's tmt command, float32 stated (the YAML's value) so no auto dtype applies
WINDOW, QUICK_WINDOW = (40, 160), (2, 6)  # (FIRST, LAST) of --peer-updates
FAIRSEQ_SPECIALS = 4  # <s>, <pad>, </s>, <unk>: fairseq's Dictionary puts them at ids 0-3 before the file's symbols
ENV_SCRIPT = "scripts/fairseq_env.sh"


class PeerError(TmtError, RuntimeError):
    """The fairseq side environment is missing or fairseq's run does not say what the comparison needs."""


# ---------------------------------------------------------------- options (added to benchmark.py's parser)
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peer", choices=("fairseq",), default=None, help="also train fairseq on the reference config in this run and report the ratio")
    p.add_argument("--fairseq-env", type=Path, default=None, help=f"fairseq side environment (default $FAIRSEQ_ENV, else .venv-fairseq; {ENV_SCRIPT} makes it)")
    p.add_argument(
        "--peer-updates",
        type=int,
        nargs=2,
        metavar=("FIRST", "LAST"),
        default=None,
        help=f"timed updates FIRST+1..LAST of both peer runs (default {WINDOW[0]} {WINDOW[1]}, quick {QUICK_WINDOW[0]} {QUICK_WINDOW[1]})",
    )
    p.add_argument("--only", choices=("peer",), default=None, help="peer: only the matmul peak and the two peer runs (needs --peer)")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults and conflicts of the peer options; parser errors exit with the usage line."""
    if args.peer_updates is None:
        args.peer_updates = list(QUICK_WINDOW if args.quick else WINDOW)
    first, last = args.peer_updates
    if not 1 <= first < last:
        p.error(f"--peer-updates {first} {last}: need 1 <= FIRST < LAST (FIRST untimed updates, then LAST - FIRST timed)")
    if args.only and not args.peer:
        p.error("--only peer needs --peer fairseq")
    if args.peer and args.device != "cpu":
        p.error("--peer fairseq is a CPU comparison (fairseq-train --cpu); leave out --device cuda")
    if args.only and (args.checkpoint or args.reference_checkpoint or args.ctranslate2):
        p.error("--only peer trains and times only the peer runs; leave out --checkpoint, --reference-checkpoint and --ctranslate2")
    if args.peer:
        try:
            args.fairseq_env = require_env(args.fairseq_env)
        except PeerError as exc:  # before any work: one line, the CLI's exit code for a user error
            p.exit(2, f"benchmark: error: {exc}\n")


def default_env() -> Path:
    return Path(os.environ.get("FAIRSEQ_ENV") or REPO / ".venv-fairseq")


def require_env(env: Path | None) -> Path:
    """The side environment's directory, or :class:`PeerError` saying how to create it."""
    env = Path(env) if env is not None else default_env()
    missing = [tool for tool in ("fairseq-train", "fairseq-preprocess") if not os.access(env / "bin" / tool, os.X_OK)]
    if missing:
        raise PeerError(
            f"{env}: no fairseq side environment ({', '.join('bin/' + m for m in missing)} missing); "
            f"create it with `{ENV_SCRIPT} {env}` (a few minutes), or pass --fairseq-env DIR"
        )
    return env.resolve()


# ---------------------------------------------------------------- the same config on both sides
def peer_config() -> Config:
    return load_config(PEER_CONFIG, overrides=list(PEER_OVERRIDES), check_files=False)


def train_command(cfg: Config, *, env: Path, data_bin: Path, save_dir: Path, last_update: int, langs: tuple[str, str] = ("en", "de")) -> list[str]:
    """The ``fairseq-train`` command that trains what ``cfg`` makes tmt train (model, optimiser, schedule, loss,
    batches), on CPU in float32, for ``last_update`` updates, logging every update as JSON, never validating or saving."""
    m, t = cfg.model, cfg.train
    unmapped = {
        "model.head_dim": m.head_dim != 0,
        "model.value_dim": m.value_dim != 0,
        "model.norm": m.norm not in ("post", "pre"),
        "model.restrict_output": m.restrict_output,
        "model.share_all_embeddings": not m.share_all_embeddings,
        "train.weight_decay": t.weight_decay != 0,
        "train.ema_decay": t.ema_decay != 0,
        "train.lr_schedule": t.lr_schedule != "inverse_sqrt",
        "train.dtype": t.dtype != "float32",
        "data.subword_alpha": cfg.data.subword_alpha != 0,
    }
    if any(unmapped.values()):
        raise PeerError(
            f"{', '.join(k for k, v in unmapped.items() if v)}: no fairseq equivalent in this comparison; "
            f"set the peer config ({PEER_CONFIG.name} + PEER_OVERRIDES) back to the fairseq-expressible values"
        )
    pre = ["--encoder-normalize-before", "--decoder-normalize-before"] if m.norm == "pre" else []  # fairseq's default is post-norm
    learned = ["--encoder-learned-pos", "--decoder-learned-pos"] if m.positions == "learned" else []
    return [
        str(env / "bin" / "fairseq-train"),
        str(data_bin),
        "--task",
        "translation",
        "--source-lang",
        langs[0],
        "--target-lang",
        langs[1],
        "--arch",
        "transformer",
        "--encoder-layers",
        str(m.encoder_layers),
        "--decoder-layers",
        str(m.decoder_layers),
        "--encoder-embed-dim",
        str(m.d_model),
        "--decoder-embed-dim",
        str(m.d_model),
        "--encoder-ffn-embed-dim",
        str(m.d_ff),
        "--decoder-ffn-embed-dim",
        str(m.d_ff),
        "--encoder-attention-heads",
        str(m.heads),
        "--decoder-attention-heads",
        str(m.heads),
        *pre,
        *learned,
        "--activation-fn",
        m.activation,
        "--dropout",
        repr(m.dropout),
        "--attention-dropout",
        repr(m.attention_dropout),
        "--activation-dropout",
        repr(m.activation_dropout),
        "--share-all-embeddings",
        "--max-source-positions",
        str(m.max_positions),
        "--max-target-positions",
        str(m.max_positions),
        "--optimizer",
        "adam",
        "--adam-betas",
        f"({t.optimizer_betas[0]!r}, {t.optimizer_betas[1]!r})",
        "--adam-eps",
        repr(t.optimizer_eps),
        "--weight-decay",
        "0",
        "--clip-norm",
        repr(t.clip_norm),
        "--lr",
        repr(t.lr),
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        str(t.warmup_updates),
        "--warmup-init-lr",
        "0",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        repr(t.label_smoothing),
        "--max-tokens",
        str(t.max_tokens),
        "--required-batch-size-multiple",
        "1",
        "--update-freq",
        str(t.update_freq),
        "--seed",
        str(t.seed),
        "--max-update",
        str(last_update),
        "--cpu",
        "--num-workers",
        "0",
        "--disable-validation",
        "--no-save",
        "--save-dir",
        str(save_dir),
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--no-progress-bar",
    ]


def write_dictionary(tok: Tokenizer, path: Path) -> int:
    """fairseq's dict.txt for ``tok``: the pieces of ids 4.. in id order (ids 0-3 are the specials on both sides),
    so fairseq id i is sentencepiece id i for every piece. Returns the dictionary size fairseq will have."""
    specials = sorted((PAD_ID, UNK_ID, BOS_ID, EOS_ID))
    if specials != list(range(FAIRSEQ_SPECIALS)):
        raise PeerError(f"sentencepiece specials are ids {specials}, expected 0-3: the id-order dictionary assumes them there")
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(FAIRSEQ_SPECIALS, tok.vocab_size):
            handle.write(f"{tok.sp.id_to_piece(i)} 1\n")  # the count is unused: a given --srcdict is neither sorted nor cut
    return tok.vocab_size


def prepare(cfg: Config, *, env: Path, out: Path, langs: tuple[str, str] = ("en", "de")) -> dict:
    """Write the pairs tmt trains on (``cfg``'s corpus after its filters) as pieces into ``out`` and binarize them;
    reused while the encoded corpus it came from is the same. Returns the data's paths and counts."""
    tok = Tokenizer(cfg.tokenizer.model)
    data = load_corpora(cfg, tok, tok, quiet=True)[0]  # what Trainer loads: same cache, same filters
    stamp = {"corpus": Path(data.summary.cache).name, "spm": str(cfg.tokenizer.model), "pairs": len(data)}
    bin_dir, stamp_path = out / "bin", out / "stamp.json"
    if stamp_path.is_file() and json.loads(stamp_path.read_text(encoding="utf-8")) == {**stamp, "done": True}:
        return json.loads((out / "prepared.json").read_text(encoding="utf-8"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tokens = {}
    for side, lang in zip((0, 1), langs):
        with open(out / f"train.{lang}", "w", encoding="utf-8") as handle:
            for i in range(len(data)):
                handle.write(" ".join(tok.sp.id_to_piece(int(x)) for x in data.pair(i)[side]) + "\n")
        tokens[lang] = int((data.src_lengths if side == 0 else data.tgt_lengths).sum()) + len(data)  # + EOS per sentence
    size = write_dictionary(tok, out / "dict.txt")
    cmd = [
        str(env / "bin" / "fairseq-preprocess"),
        "--source-lang",
        langs[0],
        "--target-lang",
        langs[1],
        "--trainpref",
        str(out / "train"),
        "--destdir",
        str(bin_dir),
        "--srcdict",
        str(out / "dict.txt"),
        "--joined-dictionary",
        "--workers",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env())
    (out / "preprocess.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise PeerError(f"fairseq-preprocess failed (exit {proc.returncode}); see {out / 'preprocess.log'}")
    counts = parse_preprocess_log(proc.stdout + proc.stderr)
    for lang in langs:  # the pieces must reach fairseq whole: a piece split at a character it takes for a space would differ here
        if counts.get(lang) != (len(data), tokens[lang], 0):
            raise PeerError(
                f"fairseq-preprocess [{lang}] read {counts.get(lang)} (sentences, tokens, replaced by <unk>), "
                f"expected {(len(data), tokens[lang], 0)}; see {out / 'preprocess.log'}"
            )
    prepared = {
        "data_bin": str(bin_dir),
        "pairs": len(data),
        "target_tokens": tokens[langs[1]],
        "source_tokens": tokens[langs[0]],
        "dictionary_size": size,
        "spm_vocab_size": tok.vocab_size,
        "corpus_cache": stamp["corpus"],
    }
    (out / "prepared.json").write_text(json.dumps(prepared, indent=1), encoding="utf-8")
    stamp_path.write_text(json.dumps({**stamp, "done": True}), encoding="utf-8")
    return prepared


def parse_preprocess_log(text: str) -> dict[str, tuple[int, int, float]]:
    """{lang: (sentences, tokens, % replaced by <unk>)} from fairseq-preprocess's summary lines."""
    out = {}
    for lang, sents, toks, replaced in re.findall(r"\[(\w+)\] \S+: (\d+) sents, (\d+) tokens(?:, ([\d.e+-]+)% replaced)?", text):
        out[lang] = (int(sents), int(toks), float(replaced or 0))
    return out


# ---------------------------------------------------------------- the run and its log
def _clean_env(threads: int | None = None) -> dict:
    """The environment for the side env's tools: unbuffered, so each log line is stamped when written; no
    PYTHONPATH or VIRTUAL_ENV of ours; OMP/MKL threads as tmt's phase has them (fairseq never sets torch's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONUNBUFFERED"] = "1"
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def parse_train_log(lines: Iterable[tuple[float, str]], *, first: int, last: int) -> dict:
    """Tokens/s of updates first+1..last from fairseq-train's JSON log, ``lines`` as (arrival seconds, text).

    Returns target_tokens (sum of wpb), seconds (sum of wpb / wps: fairseq's own per-update time), tokens_per_s,
    wall_seconds and wall_tokens_per_s (from the arrival of update first's line to update last's), updates, and
    dictionary_size (from "[lang] dictionary: N types", if logged)."""
    updates: dict[int, tuple[float, float, float]] = {}  # update -> (arrival, wpb, wps)
    dictionary = {}
    for stamp, text in lines:
        if "| train_inner | " in text:
            rec = json.loads(text.split("| train_inner | ", 1)[1])
            updates[int(rec["num_updates"])] = (stamp, float(rec["wpb"]), float(rec["wps"]))
        elif m := re.search(r"\[(\w+)\] dictionary: (\d+) types", text):
            dictionary[m.group(1)] = int(m.group(2))
    missing = [u for u in range(first, last + 1) if u not in updates]
    if missing:
        raise PeerError(
            f"fairseq's log has no train_inner line for update {missing[0]} (of {first}..{last}); it needs "
            "--log-format json --log-interval 1 and --max-update >= the last update"
        )
    window = [updates[u] for u in range(first + 1, last + 1)]
    if any(wps <= 0 for _, _, wps in window):
        raise PeerError(f"fairseq's log gives wps 0 for an update in {first + 1}..{last}: its meters were not running; time later updates")
    tokens = sum(wpb for _, wpb, _ in window)
    seconds = sum(wpb / wps for _, wpb, wps in window)
    wall = updates[last][0] - updates[first][0]
    sizes = set(dictionary.values())
    return {
        "updates": last - first,
        "target_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "wall_seconds": wall,
        "wall_tokens_per_s": tokens / wall if wall > 0 else None,
        "dictionary_size": sizes.pop() if len(sizes) == 1 else None,
    }


def phase_fairseq(spec: dict) -> dict:
    """benchmark.py's ``fairseq`` phase: run fairseq-train, stamp its lines as they arrive, parse the window."""
    shutil.rmtree(spec["save_dir"], ignore_errors=True)
    log_path, lines = Path(spec["result"]).parent / f"{spec['name']}.fairseq.log", []
    load_start = os.getloadavg()
    with (
        open(log_path, "w", encoding="utf-8") as log,
        subprocess.Popen(spec["command"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_clean_env(spec["threads"])) as proc,
    ):
        for text in proc.stdout:
            lines.append((time.perf_counter(), text.rstrip("\n")))
            log.write(text)
    if proc.returncode != 0:
        tail = "\n".join(t for _, t in lines[-15:])
        raise PeerError(f"fairseq-train failed (exit {proc.returncode}); {log_path} ends with:\n{tail}")
    out = parse_train_log(lines, first=spec["first"], last=spec["last"])
    version = subprocess.run(
        [str(Path(spec["command"][0]).with_name("python")), "-c", "import fairseq; print(fairseq.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    shutil.rmtree(spec["save_dir"], ignore_errors=True)
    return {
        **out,
        "fairseq_version": version,
        "log": str(log_path),
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "fairseq_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }  # the largest waited-for child's


# ---------------------------------------------------------------- plan and report (benchmark.py's parent side)
def plan(args, sizes, *, spm: Path, src: Path, tgt: Path, train_spec: Callable[..., dict]) -> list[dict]:
    """The two peer phases, tmt first: the benchmark's train phase on :func:`peer_config` with the peer window,
    and fairseq-train on the same pairs (binarized here, before any timing)."""
    first, last = args.peer_updates
    window = argparse.Namespace(**{**vars(args), "warmup": first, "updates": last - first})
    tmt = train_spec("peer-tmt-float32", peer_config(), dtype="float32", args=window, sizes=sizes, spm=spm, src=src, tgt=tgt, keep=False)
    cfg = from_dict(tmt["config"], source="benchmark peer")
    env = require_env(args.fairseq_env)
    print(f"benchmark: binarizing the peer's pieces for fairseq -> {args.out / 'fairseq'}", file=sys.stderr, flush=True)
    data = prepare(cfg, env=env, out=args.out / "fairseq")
    command = train_command(cfg, env=env, data_bin=Path(data["data_bin"]), save_dir=args.out / "runs" / "peer-fairseq", last_update=last)
    fairseq = {
        "kind": "fairseq",
        "name": "peer-fairseq-float32",
        "threads": args.threads,
        "command": command,
        "first": first,
        "last": last,
        "save_dir": str(args.out / "runs" / "peer-fairseq"),
        "data": data,
    }
    return [{**tmt, "peer": "tmt"}, {**fairseq, "peer": "fairseq"}]


def report(phases: list[tuple[dict, dict]], matmul: dict) -> dict:
    """The peer section of benchmark.json: both rows, the ratio, the fp32 matmul peak they are measured against."""
    (tmt_spec, tmt), (fs_spec, fs) = sorted(phases, key=lambda p: p[0]["peer"] != "tmt")
    peak = matmul["float32"]["gflops"]
    flops = tmt["flops_per_token"]  # measured on tmt's model and batches; the same model and batches up to padding on fairseq's side
    rows = {
        "tmt": {
            "tokens_per_s": tmt["tokens_per_s"],
            "seconds": tmt["seconds"],
            "target_tokens": tmt["target_tokens"],
            "vocab_size": tmt["vocab_size"],
            "parameters": tmt["parameters"],
            "peak_rss_mib": tmt["peak_rss_mib"],
        },
        "fairseq": {
            "tokens_per_s": fs["tokens_per_s"],
            "seconds": fs["seconds"],
            "target_tokens": fs["target_tokens"],
            "wall_tokens_per_s": fs["wall_tokens_per_s"],
            "vocab_size": fs["dictionary_size"],
            "version": fs["fairseq_version"],
            "peak_rss_mib": fs["fairseq_peak_rss_mib"],
            "log": fs["log"],
        },
    }
    for row in rows.values():
        row["gflops"] = flops * row["tokens_per_s"] / 1e9
        row["fraction_of_fp32_peak"] = row["gflops"] / peak
    m = tmt_spec["config"]["model"]
    return {
        "config": f"{PEER_CONFIG.relative_to(REPO)} --set " + " --set ".join(PEER_OVERRIDES),
        "model_config": m,
        "train_config": tmt_spec["config"]["train"],
        "updates": [fs_spec["first"], fs_spec["last"]],
        "threads": tmt_spec["threads"],
        "fairseq_command": fs_spec["command"],
        "data": fs_spec["data"],
        "flops_per_token": flops,
        "fp32_matmul_peak_gflops": peak,
        "rows": rows,
        "ratio": tmt["tokens_per_s"] / fs["tokens_per_s"],
        "loadavg_fairseq": [fs["loadavg_start"], fs["loadavg_end"]],
        "fairseq_tokens_per_s_method": "sum of wpb / sum of (wpb / wps) over the train_inner lines of the timed updates",
    }


def render(r: dict) -> str:
    """The peer table of benchmark.md (appended after the benchmark's own)."""
    p = r.get("peer")
    if not p:
        return ""
    m, (first, last), rows = p["model_config"], p["updates"], p["rows"]
    head = ["", "target tokens/s", "ratio", "GFLOP/s", "% of fp32 matmul peak", "tokens/update", "vocabulary", "peak RSS MiB"]
    mc = r["machine"]
    lines = [
        "",
        f"## Side by side: tmt and fairseq {rows['fairseq']['version']}, same config, same run",
        "",
        f"{r['date']}; {mc['cpu']}, {mc['logical_cpus']} logical CPUs, {p['threads']} threads; torch {mc['torch']} ({mc['cpu_capability']}); "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end; "
        f"fp32 matmul peak {p['fp32_matmul_peak_gflops']:.1f} GFLOP/s (n={r['matmul_peak']['n']}, the faster of the run's first and last timing). "
        f"Config: `{p['config']}` ({m['encoder_layers']}+{m['decoder_layers']} layers, d{m['d_model']}, ff{m['d_ff']}, {m['heads']} heads, "
        f"{m['norm']}-norm, dropout {m['dropout']:g}, activation dropout {m['activation_dropout']:g}, "
        f"{p['train_config']['max_tokens']:,}-token batches, float32). Target tokens/s over updates {first + 1}-{last}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, label in (("fairseq", f"fairseq {rows['fairseq']['version']} (`fairseq-train --cpu`, wps)"), ("tmt", "tmt (`Trainer`)")):
        row = rows[name]
        ratio = row["tokens_per_s"] / rows["fairseq"]["tokens_per_s"]
        lines.append(
            f"| {label} | {row['tokens_per_s']:,.0f} | {'**' if name == 'tmt' else ''}{ratio:.2f}{'**' if name == 'tmt' else ''} | "
            f"{row['gflops']:.1f} | {100 * row['fraction_of_fp32_peak']:.1f} | {row['target_tokens'] / (last - first):,.0f} | "
            f"{row['vocab_size']:,} | {row['peak_rss_mib']:.0f} |"
        )
    wall = rows["fairseq"]["wall_tokens_per_s"]
    lines += [
        "",
        f"fairseq tokens/s: {p['fairseq_tokens_per_s_method']}"
        + (f" (line arrival times give {wall:,.0f})" if wall else "")
        + "; GFLOP/s: tmt's measured FLOPs per target token (FlopCounterMode) x each side's tokens/s. "
        f"Same {p['data']['pairs']:,} pairs on both sides, binarized from tmt's pieces.",
    ]
    return "\n".join(lines) + "\n"
