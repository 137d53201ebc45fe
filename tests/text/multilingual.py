"""A tiny multilingual checkpoint for the tests of the target language (translator, command line, server, explorer):
a tokenizer trained over Multi30k en, de and fr with the language tags as user-defined symbols, and a random
1+1-layer model whose config names two corpora, en -> de and en -> fr, so two target languages."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import head

TARGETS = ("de", "fr")


def multilingual_checkpoint(multi30k: Path, root: Path, *, targets: tuple[str, ...] = TARGETS, seed: int = 0) -> Path:
    """root/multi.pt: a random model over a 500-piece tokenizer with <2de> and <2fr>, corpora en -> each of
    ``targets`` (one target: a model with one stated language, whose sources take no tag)."""
    from transformer_mt.checkpoint import pack_tokenizers, save_checkpoint
    from transformer_mt.config import CorpusConfig, load_config, to_dict
    from transformer_mt.model import Transformer
    from transformer_mt.text import Tokenizer, train_sentencepiece

    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for lang in ("en", *TARGETS):
        files[lang] = root / f"train.{lang}"
        files[lang].write_text("\n".join(head(multi30k / f"train.{lang}", 400)) + "\n", encoding="utf-8")
    langs = ["en", *TARGETS]
    model_file = train_sentencepiece(
        [files[lang] for lang in langs],
        root / "spm",
        vocab_size=500,
        user_defined_symbols=[f"<2{t}>" for t in TARGETS],
        languages=langs,
    )
    tok = Tokenizer(model_file)
    cfg = load_config(
        None,
        [
            "model.encoder_layers=1",
            "model.decoder_layers=1",
            "model.d_model=32",
            "model.heads=2",
            "model.d_ff=64",
            "model.max_positions=64",
            "data.max_len=60",
            "model.positions=sinusoidal",
            "decode.max_len_b=6",
            "decode.beam=2",
        ],
    )
    cfg.data.corpora = [
        CorpusConfig(name=f"en-{t}", src=str(files["en"]), tgt=str(files[t]), src_lang="en", tgt_lang=t)
        for t in targets
    ]
    torch.manual_seed(seed)
    model = Transformer(cfg.model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    path = root / "multi.pt"
    save_checkpoint(
        {"model": model.state_dict(), "config": to_dict(cfg), "tokenizers": pack_tokenizers(tok.proto)}, path
    )
    return path
