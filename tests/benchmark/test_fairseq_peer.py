"""The benchmark's fairseq peer (``python -m transformer_mt.benchmark --peer fairseq``): the fairseq command trains
the side-by-side config, the JSON-log parser's tokens/s on a hand-written excerpt, the dictionary keeps
sentencepiece's ids, a missing side environment is one line. Tests that need the side environment
(scripts/fairseq_env.sh) skip without it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.benchmark import (
    PeerError,
    parse_preprocess_log,
    parse_train_log,
    peer_config,
    prepare,
    require_env,
    train_command,
    write_dictionary,
)
from transformer_mt.config import Config
from transformer_mt.text import Tokenizer

REPO = Path(__file__).resolve().parents[2]


def side_env() -> Path:
    try:
        return require_env(None)
    except PeerError:
        pytest.skip("no fairseq side environment (scripts/fairseq_env.sh makes one)")


def command(cfg: Config | None = None, last: int = 160) -> list[str]:
    return train_command(
        cfg or peer_config(), env=Path("/env"), data_bin=Path("/bin"), save_dir=Path("/save"), last_update=last
    )


def parse_flags(argv: list[str]) -> argparse.Namespace:
    """fairseq's flags that matter here, parsed independently of the code that wrote them."""
    p = argparse.ArgumentParser()
    p.add_argument("data")
    for flag in (
        "--encoder-layers",
        "--decoder-layers",
        "--encoder-embed-dim",
        "--decoder-embed-dim",
        "--encoder-ffn-embed-dim",
        "--decoder-ffn-embed-dim",
        "--encoder-attention-heads",
        "--decoder-attention-heads",
        "--max-tokens",
        "--warmup-updates",
        "--max-update",
        "--log-interval",
        "--num-workers",
        "--required-batch-size-multiple",
        "--update-freq",
        "--seed",
    ):
        p.add_argument(flag, type=int)
    for flag in (
        "--dropout",
        "--attention-dropout",
        "--activation-dropout",
        "--lr",
        "--label-smoothing",
        "--adam-eps",
        "--weight-decay",
        "--clip-norm",
        "--warmup-init-lr",
    ):
        p.add_argument(flag, type=float)
    for flag in (
        "--task",
        "--source-lang",
        "--target-lang",
        "--arch",
        "--activation-fn",
        "--optimizer",
        "--adam-betas",
        "--lr-scheduler",
        "--criterion",
        "--log-format",
        "--save-dir",
        "--max-source-positions",
        "--max-target-positions",
    ):
        p.add_argument(flag)
    for flag in (
        "--share-all-embeddings",
        "--cpu",
        "--disable-validation",
        "--no-save",
        "--no-progress-bar",
        "--encoder-normalize-before",
        "--decoder-normalize-before",
        "--encoder-learned-pos",
        "--decoder-learned-pos",
        "--fp16",
        "--bf16",
    ):
        p.add_argument(flag, action="store_true")
    return p.parse_args(argv)


def test_command_trains_the_side_by_side_config():
    argv = command()
    assert Path(argv[0]) == Path("/env/bin/fairseq-train")
    a = parse_flags(argv[1:])  # an unknown flag would fail here too
    # the side-by-side config: 3+3 layers, d_model 256, d_ff 1024, 4 heads, post-norm, dropout 0.1, shared embeddings,
    # 4,096-token batches, Adam (0.9, 0.98), inverse_sqrt warm-up 1,000 at 5e-4, label smoothing 0.1, fp32, CPU
    assert (a.encoder_layers, a.decoder_layers, a.encoder_embed_dim, a.decoder_embed_dim) == (3, 3, 256, 256)
    assert (a.encoder_ffn_embed_dim, a.decoder_ffn_embed_dim, a.encoder_attention_heads, a.decoder_attention_heads) == (
        1024,
        1024,
        4,
        4,
    )
    assert not a.encoder_normalize_before and not a.decoder_normalize_before  # post-norm is fairseq's default
    assert (a.dropout, a.attention_dropout) == (0.1, 0.0)
    assert a.activation_dropout == 0.1  # the peer config keeps multi30k_reference.yaml's activation_dropout
    assert a.share_all_embeddings and a.arch == "transformer" and a.activation_fn == "relu"
    assert a.max_tokens == 4096 and a.required_batch_size_multiple == 1 and a.update_freq == 1
    assert (
        a.optimizer == "adam"
        and tuple(json.loads(a.adam_betas.replace("(", "[").replace(")", "]"))) == (0.9, 0.98)
        and a.adam_eps == 1e-9
    )
    assert (a.lr_scheduler, a.lr, a.warmup_updates, a.warmup_init_lr) == ("inverse_sqrt", 5e-4, 1000, 0.0)
    assert (a.criterion, a.label_smoothing, a.weight_decay, a.clip_norm) == (
        "label_smoothed_cross_entropy",
        0.1,
        0.0,
        0.0,
    )
    assert a.cpu and not a.fp16 and not a.bf16 and a.num_workers == 0
    assert a.disable_validation and a.no_save and a.max_update == 160  # nothing but training in the timed window
    assert a.log_format == "json" and a.log_interval == 1  # the parser needs one line per update


def test_command_follows_the_config_and_refuses_what_fairseq_lacks():
    cfg = peer_config()
    pre = parse_flags(
        command(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, norm="pre", d_model=128, heads=2)))[1:]
    )
    assert (
        pre.encoder_normalize_before
        and pre.decoder_normalize_before
        and (pre.encoder_embed_dim, pre.encoder_attention_heads) == (128, 2)
    )
    for section, change in (
        ("model", {"restrict_output": True}),
        ("model", {"norm": "scale"}),
        ("train", {"dtype": "bfloat16"}),
    ):
        bad = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **change)})
        with pytest.raises(PeerError, match=f"{section}.{next(iter(change))}"):
            command(bad)


def log_line(update: int, wpb: float, wps: float, *, tag: str = "train_inner") -> str:
    rec = {
        "epoch": 1,
        "update": round(update / 150, 3),
        "loss": "9.1",
        "wps": f"{wps:g}",
        "ups": "1.2",
        "wpb": f"{wpb:g}",
        "bsz": "200",
        "num_updates": str(update),
        "lr": "1e-06",
        "train_wall": "3",
        "wall": "5",
    }
    return f"2026-11-23 16:28:0{update % 10} | INFO | {tag} | {json.dumps(rec)}"


def test_train_log_tokens_per_second():
    lines = [
        (0.0, "2026-11-23 16:27:57 | INFO | fairseq.tasks.translation | [en] dictionary: 8000 types"),
        (0.0, "2026-11-23 16:27:57 | INFO | fairseq.tasks.translation | [de] dictionary: 8000 types"),
        (1.0, log_line(1, 2000, 0)),  # the first line's meter has no interval yet
        (10.0, log_line(2, 3000, 1000)),
        (12.5, log_line(3, 3000, 1500)),  # 2 s
        (13.0, log_line(4, 2000, 4000)),  # 0.5 s
        (13.1, log_line(4, 9999, 9999, tag="train")),  # the epoch summary: not an update
        (14.0, log_line(5, 1000, 1000)),
    ]
    out = parse_train_log(lines, first=2, last=4)
    # updates 3 and 4: 5000 tokens in 2 + 0.5 s by fairseq's meters; 3 s between the lines of updates 2 and 4
    assert (
        out["target_tokens"] == 5000
        and out["seconds"] == pytest.approx(2.5)
        and out["tokens_per_s"] == pytest.approx(2000)
    )
    assert out["wall_seconds"] == pytest.approx(3.0) and out["wall_tokens_per_s"] == pytest.approx(5000 / 3)
    assert out["updates"] == 2 and out["dictionary_size"] == 8000
    with pytest.raises(PeerError, match="update 6"):
        parse_train_log(lines, first=4, last=6)
    with pytest.raises(PeerError, match="wps 0"):
        parse_train_log([(0.0, log_line(1, 100, 50)), (1.0, log_line(2, 100, 0))], first=1, last=2)


def test_preprocess_log_counts():
    text = (
        "2026-11-23 16:20:01 | INFO | fairseq_cli.preprocess | [en] Dictionary: 8000 types\n"
        "2026-11-23 16:20:03 | INFO | fairseq_cli.preprocess | [en] /b/fairseq/train.en: "
        "29000 sents, 415123 tokens, 0.0% replaced (by <unk>)\n"
        "2026-11-23 16:20:05 | INFO | fairseq_cli.preprocess | [de] /b/fairseq/train.de: "
        "29000 sents, 431000 tokens, 0.012% replaced (by <unk>)\n"
    )
    assert parse_preprocess_log(text) == {"en": (29000, 415123, 0.0), "de": (29000, 431000, 0.012)}


def test_dictionary_keeps_sentencepiece_ids(spm_model, tmp_path):
    tok = Tokenizer(spm_model)
    size = write_dictionary(tok, tmp_path / "dict.txt")
    lines = (tmp_path / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert size == tok.vocab_size == len(lines) + 4  # fairseq's <s> <pad> </s> <unk> come first, at ids 0-3
    fields = [line.split() for line in lines]
    assert all(len(f) == 2 for f in fields)  # "piece count": a piece with whitespace in it would break fairseq's reader
    pieces = [f[0] for f in fields]
    assert pieces == [tok.sp.id_to_piece(i) for i in range(4, tok.vocab_size)] and len(set(pieces)) == len(pieces)
    assert not {"<s>", "<pad>", "</s>", "<unk>"} & set(pieces)


@pytest.mark.slow
def test_missing_env_is_one_line(tmp_path):
    with pytest.raises(PeerError, match="scripts/fairseq_env.sh"):
        require_env(tmp_path / "nowhere")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "benchmark.py"),
            "--peer",
            "fairseq",
            "--only",
            "peer",
            "--fairseq-env",
            str(tmp_path / "nowhere"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "scripts/fairseq_env.sh" in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_fairseqs_own_parser_reads_the_command():
    env = side_env()
    code = (
        "import json, sys\nfrom fairseq import options\n"
        "a = options.parse_args_and_arch(options.get_training_parser(), input_args=sys.argv[1:])\n"
        "print(json.dumps({k: getattr(a, k) for k in ('encoder_layers', 'decoder_ffn_embed_dim', "
        "'encoder_attention_heads', 'encoder_normalize_before', 'attention_dropout', 'activation_dropout', "
        "'share_all_embeddings', 'max_tokens', 'adam_betas', 'warmup_updates', 'label_smoothing', 'cpu', 'fp16', "
        "'no_save', 'disable_validation', 'required_batch_size_multiple')}))"
    )
    proc = subprocess.run(
        [str(env / "bin" / "python"), "-c", code, *command()[1:]], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "encoder_layers": 3,
        "decoder_ffn_embed_dim": 1024,
        "encoder_attention_heads": 4,
        "encoder_normalize_before": False,
        "attention_dropout": 0.0,
        "activation_dropout": 0.1,
        "share_all_embeddings": True,
        "max_tokens": 4096,
        "adam_betas": "(0.9, 0.98)",
        "warmup_updates": 1000,
        "label_smoothing": 0.1,
        "cpu": True,
        "fp16": False,
        "no_save": True,
        "disable_validation": True,
        "required_batch_size_multiple": 1,
    }


@pytest.mark.slow
def test_binarized_pieces_are_tmts_ids(corpus_slice, spm_model, tmp_path):
    from tests.conftest import run_config
    from transformer_mt.data import load_corpora

    env = side_env()
    cfg = run_config(corpus_slice, spm_model, tmp_path / "run", "data.max_len=100")
    prepared = prepare(cfg, env=env, out=tmp_path / "fairseq")
    data = load_corpora(cfg, Tokenizer(spm_model), Tokenizer(spm_model), quiet=True)[0]
    assert prepared["pairs"] == len(data) and prepared["dictionary_size"] == Tokenizer(spm_model).vocab_size
    code = (
        "import json, sys\nfrom fairseq.data import Dictionary, data_utils\nd = Dictionary.load(sys.argv[1])\n"
        "ds = data_utils.load_indexed_dataset(sys.argv[2], d)\n"
        "print(json.dumps({'size': len(d), 'n': len(ds), 'first': [ds[i].tolist() for i in range(5)], 'eos': d.eos()}))"
    )
    out = {}
    for side, lang in ((0, "en"), (1, "de")):
        proc = subprocess.run(
            [
                str(env / "bin" / "python"),
                "-c",
                code,
                str(tmp_path / "fairseq" / "dict.txt"),
                str(Path(prepared["data_bin"]) / f"train.en-de.{lang}"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["size"] == Tokenizer(spm_model).vocab_size and out["n"] == len(data)
        # fairseq's id of every piece is sentencepiece's (both put 4 specials first); fairseq appends its own EOS
        assert out["first"] == [data.pair(i)[side].tolist() + [out["eos"]] for i in range(5)]
