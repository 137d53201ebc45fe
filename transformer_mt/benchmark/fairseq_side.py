"""fairseq made to do the work tmt does: the same config and the very same pairs, in fairseq's side environment.

  config     configs/multi30k_reference.yaml with PEER_OVERRIDES (3+3 layers, d_model 256, d_ff 1024, 4 heads,
             post-norm, dropout 0.1, activation dropout 0.1 and attention dropout 0 from the YAML, shared
             embeddings, 4096-token batches, Adam (0.9, 0.98) eps 1e-9, inverse_sqrt peak 5e-4 after 1000 warm-up
             updates, label smoothing 0.1, float32); :func:`train_command` maps every field that changes the work
             to fairseq's flag and refuses a field fairseq has no flag for.
  data       the very pairs tmt trains on (its encoded corpus, after its length filters) written as sentencepiece
             pieces, binarized by ``fairseq-preprocess --joined-dictionary`` with a dictionary built from the
             sentencepiece vocabulary in id order: fairseq's 4 specials take ids 0-3 as sentencepiece's own 4 do,
             so both sides have the same vocabulary size (checked from fairseq's log) and the same token counts.
             ``--required-batch-size-multiple 1`` makes fairseq's batches the greedy cut that tmt's are (sorted by
             length, a batch's size = its longest side x sentences <= max_tokens).

The side environment is made by scripts/fairseq_env.sh; how the two runs are timed:
:mod:`transformer_mt.benchmark.peer`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from transformer_mt.benchmark.settings import REPO
from transformer_mt.config import Config, load_config
from transformer_mt.data import load_corpora
from transformer_mt.errors import TmtError
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

PEER_CONFIG = REPO / "configs" / "multi30k_reference.yaml"
# The side-by-side config; float32 stated (the YAML's value) so that no auto dtype applies.
PEER_OVERRIDES = (
    "model.norm=post",
    "model.dropout=0.1",
    "train.max_tokens=4096",
    "train.lr=5e-4",
    "train.warmup_updates=1000",
    "train.dtype=float32",
)
FAIRSEQ_SPECIALS = 4  # <s>, <pad>, </s>, <unk>: fairseq's Dictionary puts them at ids 0-3 before the file's symbols
ENV_SCRIPT = "scripts/fairseq_env.sh"


class PeerError(TmtError, RuntimeError):
    """The fairseq side environment is missing or fairseq's run does not say what the comparison needs."""


# ---------------------------------------------------------------- the side environment
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


def clean_env(threads: int | None = None) -> dict:
    """The environment for the side env's tools: unbuffered, so each log line is stamped when written; no
    PYTHONPATH or VIRTUAL_ENV of ours; OMP/MKL threads as tmt's phase has them (fairseq never sets torch's)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# ---------------------------------------------------------------- the same config on both sides
def peer_config() -> Config:
    return load_config(PEER_CONFIG, overrides=list(PEER_OVERRIDES), check_files=False)


def _check_mappable(cfg: Config) -> None:
    """:class:`PeerError` naming each field of ``cfg`` that changes the work and has no fairseq flag here."""
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


def train_command(
    cfg: Config, *, env: Path, data_bin: Path, save_dir: Path, last_update: int, langs: tuple[str, str] = ("en", "de")
) -> list[str]:
    """The ``fairseq-train`` command that trains what ``cfg`` makes tmt train (model, optimiser, schedule, loss,
    batches), on CPU in float32, for ``last_update`` updates, logging every update as JSON, never validating or
    saving."""
    _check_mappable(cfg)
    m, t = cfg.model, cfg.train
    # fairseq's default is post-norm
    pre = ["--encoder-normalize-before", "--decoder-normalize-before"] if m.norm == "pre" else []
    learned = ["--encoder-learned-pos", "--decoder-learned-pos"] if m.positions == "learned" else []
    task = [
        str(env / "bin" / "fairseq-train"),
        str(data_bin),
        "--task",
        "translation",
        "--source-lang",
        langs[0],
        "--target-lang",
        langs[1],
    ]
    layers = [
        "--arch",
        "transformer",
        "--encoder-layers",
        str(m.encoder_layers),
        "--decoder-layers",
        str(m.decoder_layers),
    ]
    widths = ["--encoder-embed-dim", str(m.d_model), "--decoder-embed-dim", str(m.d_model)]
    widths += ["--encoder-ffn-embed-dim", str(m.d_ff), "--decoder-ffn-embed-dim", str(m.d_ff)]
    heads = ["--encoder-attention-heads", str(m.heads), "--decoder-attention-heads", str(m.heads)]
    model = [
        "--activation-fn",
        m.activation,
        "--dropout",
        repr(m.dropout),
        "--attention-dropout",
        repr(m.attention_dropout),
    ]
    model += ["--activation-dropout", repr(m.activation_dropout), "--share-all-embeddings"]
    model += ["--max-source-positions", str(m.max_positions), "--max-target-positions", str(m.max_positions)]
    adam = [
        "--optimizer",
        "adam",
        "--adam-betas",
        f"({t.optimizer_betas[0]!r}, {t.optimizer_betas[1]!r})",
        "--adam-eps",
        repr(t.optimizer_eps),
    ]
    optim = [*adam, "--weight-decay", "0", "--clip-norm", repr(t.clip_norm), "--lr", repr(t.lr)]
    optim += ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(t.warmup_updates), "--warmup-init-lr", "0"]
    loss = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", repr(t.label_smoothing)]
    batches = [
        "--max-tokens",
        str(t.max_tokens),
        "--required-batch-size-multiple",
        "1",
        "--update-freq",
        str(t.update_freq),
    ]
    run = [
        "--seed",
        str(t.seed),
        "--max-update",
        str(last_update),
        "--cpu",
        "--num-workers",
        "0",
        "--disable-validation",
        "--no-save",
    ]
    run += ["--save-dir", str(save_dir), "--log-format", "json", "--log-interval", "1", "--no-progress-bar"]
    return [*task, *layers, *widths, *heads, *pre, *learned, *model, *optim, *loss, *batches, *run]


# ---------------------------------------------------------------- the same pairs on both sides
def write_dictionary(tok: Tokenizer, path: Path) -> int:
    """fairseq's dict.txt for ``tok``: the pieces of ids 4.. in id order (ids 0-3 are the specials on both sides),
    so fairseq id i is sentencepiece id i for every piece. Returns the dictionary size fairseq will have."""
    specials = sorted((PAD_ID, UNK_ID, BOS_ID, EOS_ID))
    if specials != list(range(FAIRSEQ_SPECIALS)):
        raise PeerError(
            f"sentencepiece specials are ids {specials}, expected 0-3: the id-order dictionary assumes them there"
        )
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(FAIRSEQ_SPECIALS, tok.vocab_size):
            # the count is unused: a given --srcdict is neither sorted nor cut
            handle.write(f"{tok.sp.id_to_piece(i)} 1\n")
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
    for side, lang in zip((0, 1), langs, strict=True):
        with open(out / f"train.{lang}", "w", encoding="utf-8") as handle:
            for i in range(len(data)):
                handle.write(" ".join(tok.sp.id_to_piece(int(x)) for x in data.pair(i)[side]) + "\n")
        lengths = data.src_lengths if side == 0 else data.tgt_lengths
        tokens[lang] = int(lengths.sum()) + len(data)  # + EOS per sentence
    size = write_dictionary(tok, out / "dict.txt")
    _binarize(env, out, bin_dir, langs=langs, expected={lang: (len(data), tokens[lang], 0) for lang in langs})
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


def _binarize(
    env: Path, out: Path, bin_dir: Path, *, langs: tuple[str, str], expected: dict[str, tuple[int, int, int]]
) -> None:
    """``fairseq-preprocess`` of out/train.{langs} with out/dict.txt into ``bin_dir``; :class:`PeerError` unless
    its log reports ``expected`` (sentences, tokens, replaced by <unk>) per language."""
    cmd = [
        str(env / "bin" / "fairseq-preprocess"),
        "--source-lang",
        langs[0],
        "--target-lang",
        langs[1],
        "--trainpref",
        str(out / "train"),
    ]
    cmd += ["--destdir", str(bin_dir), "--srcdict", str(out / "dict.txt"), "--joined-dictionary", "--workers", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    (out / "preprocess.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise PeerError(f"fairseq-preprocess failed (exit {proc.returncode}); see {out / 'preprocess.log'}")
    counts = parse_preprocess_log(proc.stdout + proc.stderr)
    # the pieces must reach fairseq whole: a piece split at a character it takes for a space would differ here
    for lang in langs:
        if counts.get(lang) != expected[lang]:
            raise PeerError(
                f"fairseq-preprocess [{lang}] read {counts.get(lang)} (sentences, tokens, replaced by <unk>), "
                f"expected {expected[lang]}; see {out / 'preprocess.log'}"
            )


def parse_preprocess_log(text: str) -> dict[str, tuple[int, int, float]]:
    """{lang: (sentences, tokens, % replaced by <unk>)} from fairseq-preprocess's summary lines."""
    out = {}
    for lang, sents, toks, replaced in re.findall(
        r"\[(\w+)\] \S+: (\d+) sents, (\d+) tokens(?:, ([\d.e+-]+)% replaced)?", text
    ):
        out[lang] = (int(sents), int(toks), float(replaced or 0))
    return out
