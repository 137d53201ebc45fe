"""`tmt preprocess`: the memory-mapped cache holds exactly the ids of direct encoding, is written in
bounded chunks, and `tmt train` with the same config reuses both the tokenizer and the cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import head, run_cli
from transformer_mt.config import load_config
from transformer_mt.data import corpus as data_module
from transformer_mt.data import load_parallel
from transformer_mt.text import Tokenizer

MAX_LEN = 40  # pieces: drops some of the 2000 Multi30k pairs, so the filters are exercised too


@pytest.fixture()
def config(corpus_slice, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        json.dumps(
            {
                "data": {
                    "train_src": str(corpus_slice["train.en"]),
                    "train_tgt": str(corpus_slice["train.de"]),
                    "valid_src": str(corpus_slice["val.en"]),
                    "valid_tgt": str(corpus_slice["val.de"]),
                    "max_len": MAX_LEN,
                },
                "tokenizer": {"vocab_size": 400},  # no model given: trained into out_dir, as `tmt train` would
                "model": {
                    "encoder_layers": 1,
                    "decoder_layers": 1,
                    "d_model": 32,
                    "heads": 2,
                    "d_ff": 64,
                    "max_positions": 64,
                },
                "train": {
                    "out_dir": str(tmp_path / "run"),
                    "max_updates": 1,
                    "max_tokens": 500,
                    "threads": 1,
                    "valid_bleu_sentences": -1,
                    "device": "cpu",
                },
            }
        )
    )
    return path


@pytest.mark.slow  # trains a tokenizer, encodes 2100 pairs and runs `tmt train`
def test_preprocess_reads_back_direct_encoding_in_chunks_and_train_reuses_it(
    config, corpus_slice, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(data_module, "CHUNK_LINES", 300)
    sizes: list[int] = []
    real_encode = Tokenizer.encode

    def counting_encode(self: Tokenizer, lines: list[str]) -> list[list[int]]:
        sizes.append(len(lines))
        return real_encode(self, lines)

    monkeypatch.setattr(Tokenizer, "encode", counting_encode)
    code, out, err = run_cli(["preprocess", "-c", str(config)], capsys)
    assert code == 0, err
    assert "2,000 pairs read" in out and "100 pairs read" in out and out.count("(written)") == 2
    # streamed: the 2000 + 100 lines were encoded 300 at a time (source and target), never all at once
    assert max(sizes) <= 300 and len(sizes) == 2 * (7 + 1)
    monkeypatch.undo()

    run = tmp_path / "run"
    tok = Tokenizer(run / "spm.model")
    cfg = load_config(config)
    train = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, cfg.data, cache_dir=run / "cache"
    )
    assert train.summary.from_cache and isinstance(train._src_tokens, np.memmap)
    # every kept pair reads back as the direct encoding of its lines; the kept lines are exactly
    # those the filters keep, decided here from the direct encodings
    src_lines, tgt_lines = head(corpus_slice["train.en"], 2000), head(corpus_slice["train.de"], 2000)
    src_ids, tgt_ids = tok.encode([s.strip() for s in src_lines]), tok.encode([t.strip() for t in tgt_lines])

    def kept(s, t):
        longer, shorter = max(len(s), len(t)), min(len(s), len(t))
        ratio_ok = longer < cfg.data.min_len_for_ratio or longer <= cfg.data.max_len_ratio * shorter
        return 0 < len(s) <= MAX_LEN and 0 < len(t) <= MAX_LEN and ratio_ok

    expected = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids)) if kept(s, t)]
    assert 1000 < len(expected) < 2000 and train.line_numbers.tolist() == expected
    for i, line in enumerate(expected):
        src, tgt = train.pair(i)
        assert src.tolist() == src_ids[line] and tgt.tolist() == tgt_ids[line], f"pair {i} (line {line + 1})"

    # training with the same config finds the tokenizer and both caches: nothing is retrained or re-encoded
    caches = sorted(p.name for p in (run / "cache").iterdir())
    code, _, err = run_cli(["train", "-c", str(config)], capsys)
    assert code == 0, err
    log = (run / "train.log").read_text()
    assert "reusing sentencepiece model" in log and "training sentencepiece" not in log
    assert log.count("(loaded)") == 2 and "(written)" not in log
    assert sorted(p.name for p in (run / "cache").iterdir()) == caches
