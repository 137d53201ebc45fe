"""Shared test helpers and fixtures: the real Multi30k corpus from ../shared, slices of it and a small
sentencepiece model on one, tiny models (random, or trained once per session), and the command line.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from transformer_mt.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("TMT_MULTI30K", REPO.parent / "shared" / "data" / "multi30k"))


def head(path: Path, n: int, *, skip: int = 0) -> list[str]:
    """Lines skip..skip+n of a corpus file, newline stripped."""
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in itertools.islice(handle, skip, skip + n)]


# ---------------------------------------------------------------- tiny random models
TINY_VOCAB = 40  # 4 special ids + 36 symbols
TINY_MODEL = ModelConfig(
    encoder_layers=2, decoder_layers=2, d_model=32, heads=4, d_ff=64, dropout=0.0, max_positions=64
)


def tiny_model_config(**changes) -> ModelConfig:
    """TINY_MODEL (2+2 layers, d_model 32, 4 heads, d_ff 64, no dropout, 64 positions) with `changes`."""
    return dataclasses.replace(TINY_MODEL, **changes)


def tiny_model(
    vocab: int = TINY_VOCAB,
    *,
    seed: int = 0,
    src_vocab: int | None = None,
    tgt_vocab: int | None = None,
    config: ModelConfig | None = None,
    **changes,
):
    """A randomly initialised Transformer (torch seeded with `seed` first) in eval mode: `config`
    (default TINY_MODEL) with `changes`; `vocab` for both sides unless src_vocab / tgt_vocab say otherwise."""
    from transformer_mt.model import Transformer

    torch.manual_seed(seed)
    cfg = dataclasses.replace(config or TINY_MODEL, **changes)
    return Transformer(cfg, src_vocab_size=src_vocab or vocab, tgt_vocab_size=tgt_vocab or vocab).eval()


def tokens(lengths: list[int], *, bos: bool = False, seed: int = 1, vocab: int = TINY_VOCAB) -> torch.Tensor:
    """Right-padded (B, max(lengths)) batch of random real tokens (ids >= 4), BOS first if asked."""
    from transformer_mt.text import BOS_ID, PAD_ID

    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID)
    for row, n in enumerate(lengths):
        out[row, :n] = torch.randint(4, vocab, (n,), generator=g)
        if bos:
            out[row, 0] = BOS_ID
    return out


def make_checkpoint(
    spm_model: Path, path: Path, *, seed: int = 0, d_model: int = 32, positions: str = "learned"
) -> Path:
    """A randomly initialised 1+1-layer model with its tokenizer, saved as an inference checkpoint:
    enough to test plumbing, not quality (for a trained one, see `tiny_checkpoint`)."""
    from transformer_mt.checkpoint import pack_tokenizers, save_checkpoint
    from transformer_mt.config import load_config, to_dict
    from transformer_mt.model import Transformer
    from transformer_mt.text import Tokenizer

    cfg = load_config(
        None,
        [
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            f"model.d_model={d_model}",
            "model.heads=2",
            "model.d_ff=64",
            "model.max_positions=64",
            "data.max_len=60",
            f"model.positions={positions}",
            "decode.max_len_b=6",
            "decode.beam=3",
        ],
    )
    tok = Tokenizer(spm_model)
    torch.manual_seed(seed)
    model = Transformer(cfg.model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    save_checkpoint(
        {"model": model.state_dict(), "config": to_dict(cfg), "tokenizers": pack_tokenizers(tok.proto)}, path
    )
    return path


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module (use with ``pytestmark = pytest.mark.usefixtures("one_thread")``):
    tiny matmuls gain nothing from more, and on a busy 2-core machine their spin-waits make each op
    many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- the command line
def run_cli(argv: list, capsys) -> tuple[int, str, str]:
    """`tmt ARGV` through the console entry point in this process: (exit code, stdout, stderr)."""
    from transformer_mt.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    code = exit_.value.code
    assert code is None or isinstance(code, int), code  # main exits with a number, never a message
    captured = capsys.readouterr()
    return code or 0, captured.out, captured.err


@pytest.fixture(scope="session", autouse=True)
def _peak_cache(tmp_path_factory) -> None:
    """Training measures the machine's matmul peak once for its cost report and caches it: in the tests,
    in a temporary folder (child processes inherit it), never in the user's ~/.cache/tmt."""
    os.environ["TMT_CACHE_DIR"] = str(tmp_path_factory.mktemp("tmt_cache"))


@pytest.fixture(scope="session")
def multi30k() -> Path:
    if not (MULTI30K / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K}; set TMT_MULTI30K")
    return MULTI30K


@pytest.fixture(scope="session")
def corpus_slice(multi30k, tmp_path_factory) -> dict[str, Path]:
    """The first 2000 training pairs and 100 validation pairs of Multi30k en-de, as files."""
    root = tmp_path_factory.mktemp("m30k")
    out = {}
    for split, n in (("train", 2000), ("val", 100)):
        for lang in ("en", "de"):
            path = root / f"{split}.{lang}"
            path.write_text("\n".join(head(multi30k / f"{split}.{lang}", n)) + "\n", encoding="utf-8")
            out[f"{split}.{lang}"] = path
    return out


@pytest.fixture(scope="session")
def pairs64(multi30k, tmp_path_factory) -> dict[str, Path]:
    """64 short real training pairs (target of at most 10 words) and the first 16 validation pairs, as files."""
    en, de = head(multi30k / "train.en", 3000), head(multi30k / "train.de", 3000)
    chosen = [(s, t) for s, t in zip(en, de) if len(t.split()) <= 10][:64]
    root = tmp_path_factory.mktemp("pairs64")
    files = {}
    for name, lines in (
        ("train.en", [s for s, _ in chosen]),
        ("train.de", [t for _, t in chosen]),
        ("val.en", head(multi30k / "val.en", 16)),
        ("val.de", head(multi30k / "val.de", 16)),
    ):
        files[name] = root / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def run_config(corpus: dict[str, Path], spm_model: Path, out_dir: Path, *overrides: str):
    """A training Config on `corpus` files ("train.en/de", "val.en/de"), with the tokenizer `spm_model`,
    train.out_dir `out_dir`, train.device cpu (a GPU host would otherwise pick cuda; cuda-marked tests override it)
    and `overrides` ("section.key=value", as --set)."""
    from transformer_mt.config import load_config

    return load_config(
        None,
        [
            f"data.train_src={corpus['train.en']}",
            f"data.train_tgt={corpus['train.de']}",
            f"data.valid_src={corpus['val.en']}",
            f"data.valid_tgt={corpus['val.de']}",
            f"tokenizer.model={spm_model}",
            f"train.out_dir={out_dir}",
            "train.device=cpu",
            *overrides,
        ],
    )


@pytest.fixture(scope="session")
def spm_model(corpus_slice, tmp_path_factory) -> Path:
    """A joint 1000-piece unigram model trained on the 2000-pair slice."""
    from transformer_mt.text import train_sentencepiece

    prefix = tmp_path_factory.mktemp("spm") / "joint"
    return train_sentencepiece([corpus_slice["train.en"], corpus_slice["train.de"]], prefix, vocab_size=1000)


# ---------------------------------------------------------------- one tiny trained model, shared
# Trained once per session through the real `train()`, for the tests that need a model which has
# learned something (attention maps, export parity, the server): about 5 s each on one CPU thread.
# After 150 updates it writes varied German ("Ein Mann mit einem ..."), not one repeated token.
TINY_RUN = [
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=32",
    "model.heads=4",
    "model.d_ff=64",
    "model.dropout=0.0",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.005",
    "train.warmup_updates=20",
    "train.max_tokens=2000",
    "train.max_updates=150",
    "train.validate_every=75",
    "train.valid_bleu_sentences=8",
    "train.log_every=25",
    "train.keep_last=2",
    "train.threads=1",
    "train.seed=7",
    "decode.beam=2",
]
TRAINED_FIXTURES = {"tiny_run", "tiny_run_postnorm", "tiny_checkpoint", "tiny_checkpoint_postnorm"}


@dataclass(frozen=True)
class TrainedRun:
    """A finished tiny `tmt train` run. Its files are shared by the whole session: read, never write."""

    run_dir: Path  # train.log, metrics.jsonl, config.yaml, checkpoint_{last,best,75,150}.pt
    checkpoint: Path  # run_dir / "checkpoint_last.pt" (update 150)
    spm_model: Path  # the joint tokenizer (also packed inside the checkpoint)
    corpus: dict[str, Path]  # the corpus_slice files it trained ("train.en/de") and validated ("val.en/de") on


def _train_tiny(corpus_slice: dict[str, Path], spm_model: Path, out_dir: Path, *extra: str) -> TrainedRun:
    from transformer_mt.training import train

    cfg = run_config(corpus_slice, spm_model, out_dir, *TINY_RUN, *extra)
    result = train(cfg)
    assert result.progress.update == cfg.train.max_updates, result.stop_reason
    return TrainedRun(
        run_dir=out_dir, checkpoint=out_dir / "checkpoint_last.pt", spm_model=spm_model, corpus=corpus_slice
    )


@pytest.fixture(scope="session")
def tiny_run(corpus_slice, spm_model, tmp_path_factory) -> TrainedRun:
    """Pre-norm, 2+2 layers, d_model 32, 4 heads, shared 1000-piece vocabulary: 150 updates on the
    2000-pair slice, validated at updates 75 and 150 (loss on 100 pairs, greedy BLEU on 8)."""
    return _train_tiny(corpus_slice, spm_model, tmp_path_factory.mktemp("tiny_run") / "run", "model.norm=pre")


@pytest.fixture(scope="session")
def tiny_run_postnorm(corpus_slice, spm_model, tmp_path_factory) -> TrainedRun:
    """As `tiny_run`, with post-norm layers (the paper's)."""
    return _train_tiny(corpus_slice, spm_model, tmp_path_factory.mktemp("tiny_run_post") / "run", "model.norm=post")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_run) -> Path:
    """checkpoint_last.pt of `tiny_run` (pre-norm)."""
    return tiny_run.checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint_postnorm(tiny_run_postnorm) -> Path:
    """checkpoint_last.pt of `tiny_run_postnorm` (post-norm)."""
    return tiny_run_postnorm.checkpoint


def pytest_collection_modifyitems(items) -> None:
    """A test that needs a trained model is slow (it trains one, the first time): mark it so. A test marked
    `cuda` is skipped where torch sees no CUDA GPU."""
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if TRAINED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
            item.add_marker(no_gpu)


def pytest_terminal_summary(terminalreporter) -> None:
    """How many cases the hostile-input suites tried (tests/hostile.py), so CI's log shows it."""
    from tests.hostile import summary_line

    line = summary_line()
    if line:
        terminalreporter.write_line(line)
