"""Reading, validation and the encoded-corpus cache, on real Multi30k."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypedDict

import pytest

from tests.conftest import head
from transformer_mt.config import DataConfig
from transformer_mt.data import DataError, load_parallel
from transformer_mt.data import corpus as data
from transformer_mt.text import TextError, Tokenizer, train_sentencepiece


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Filtered(TypedDict):
    """What :func:`naive_filter` finds: the pairs dropped for each reason, and the line numbers kept."""

    empty: int
    too_long: int
    ratio: int
    kept: list[int]


def naive_filter(src: list[str], tgt: list[str], tok: Tokenizer, cfg: DataConfig) -> Filtered:
    """The filtering rules of transformer_mt.data.corpus, restated one pair at a time."""
    out: Filtered = {"empty": 0, "too_long": 0, "ratio": 0, "kept": []}
    for lineno, (s, t) in enumerate(zip(src, tgt)):
        s, t = s.strip(), t.strip()
        if not s or not t:
            out["empty"] += 1
            continue
        ls, lt = len(tok.encode([s])[0]), len(tok.encode([t])[0])
        if ls > cfg.max_len or lt > cfg.max_len:
            out["too_long"] += 1
        elif max(ls, lt) >= cfg.min_len_for_ratio and max(ls, lt) > cfg.max_len_ratio * min(ls, lt):
            out["ratio"] += 1
        else:
            out["kept"].append(lineno)
    return out


# --------------------------------------------------------------------------- validation


def test_unequal_line_counts_name_both_files_and_counts(tmp_path, multi30k, tok):
    src = write(tmp_path / "a.en", head(multi30k / "train.en", 7))
    tgt = write(tmp_path / "a.de", head(multi30k / "train.de", 6))
    with pytest.raises(DataError) as err:
        load_parallel(src, tgt, tok, tok, DataConfig(), cache_dir=tmp_path / "cache", quiet=True)
    msg = str(err.value)
    assert f"{src} has 7 lines" in msg and f"{tgt} has 6" in msg and "\n" not in msg
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_invalid_utf8_names_file_and_line(tmp_path, multi30k, tok):
    src = write(tmp_path / "b.en", head(multi30k / "train.en", 5))
    lines = [line.encode() for line in head(multi30k / "train.de", 5)]
    lines[3] = "Ein Mädchen".encode("latin-1")  # a file saved in the wrong encoding
    tgt = tmp_path / "b.de"
    tgt.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(
        TextError, match=rf"^{tgt}:4: invalid UTF-8 .*iconv"
    ) as err:  # textio's error, as every reader gives
        load_parallel(src, tgt, tok, tok, DataConfig(), cache_dir=tmp_path / "cache", quiet=True)
    assert "\n" not in str(err.value)
    leftovers = list((tmp_path / "cache").iterdir())
    assert leftovers == [], f"a failed encode left {leftovers}"


def test_summary_counts_empty_long_and_ratio_pairs(tmp_path, multi30k, tok):
    src, tgt = head(multi30k / "train.en", 300), head(multi30k / "train.de", 300)
    # Constructed drops on top of what the real data gives: 3 empty pairs, 1 over-long, 1 extreme ratio.
    src[10], tgt[20], src[30], tgt[30] = "", "", "   ", "\t"
    src[40], tgt[40] = " ".join(src[41:46]), " ".join(tgt[41:46])
    src[50], tgt[50] = "Dogs.", tgt[51]
    cfg = DataConfig(max_len=50, max_len_ratio=1.8, min_len_for_ratio=5)
    expected = naive_filter(src, tgt, tok, cfg)
    assert expected["empty"] == 3 and expected["too_long"] >= 1 and expected["ratio"] >= 1
    assert 40 not in expected["kept"] and 50 not in expected["kept"]

    d = load_parallel(
        write(tmp_path / "c.en", src),
        write(tmp_path / "c.de", tgt),
        tok,
        tok,
        cfg,
        cache_dir=tmp_path / "cache",
        quiet=True,
    )
    s = d.summary
    assert (s.pairs_read, s.dropped_empty, s.dropped_too_long, s.dropped_ratio) == (
        300,
        3,
        expected["too_long"],
        expected["ratio"],
    )
    assert s.kept == d.num_pairs == len(expected["kept"]) == 300 - 3 - expected["too_long"] - expected["ratio"]
    assert d.line_numbers.tolist() == expected["kept"]
    kept_src = tok.encode([src[i].strip() for i in expected["kept"]])
    assert s.src_tokens == sum(map(len, kept_src)) and s.src_max == max(map(len, kept_src))
    text = s.format()
    assert (
        "300 pairs read" in text
        and f"{s.kept} kept" in text
        and "3 empty" in text
        and f"{s.dropped_ratio} with length ratio over 1.8" in text
    )

    # Validation path: only the empty pairs go; the summary counts what the filters would have removed.
    v = load_parallel(
        tmp_path / "c.en", tmp_path / "c.de", tok, tok, cfg, cache_dir=tmp_path / "cache", filter_long=False, quiet=True
    )
    assert (
        v.num_pairs == 297
        and v.summary.dropped_empty == 3
        and v.summary.dropped_too_long == v.summary.dropped_ratio == 0
    )
    assert v.summary.long_kept == expected["too_long"] + expected["ratio"]
    assert v.line_numbers.tolist() == [i for i in range(300) if i not in (10, 20, 30)]
    assert v.texts("tgt") == [tgt[i].strip() for i in v.line_numbers] and v.texts("src")[40] == src[43]


def test_crlf_and_byte_order_mark_read_as_plain_lines(tmp_path, multi30k, tok):
    src, tgt = head(multi30k / "train.en", 20), head(multi30k / "train.de", 20)
    clean = load_parallel(
        write(tmp_path / "d.en", src),
        write(tmp_path / "d.de", tgt),
        tok,
        tok,
        DataConfig(),
        cache_dir=tmp_path / "c1",
        quiet=True,
    )
    (tmp_path / "e.en").write_bytes(b"\xef\xbb\xbf" + "".join(s + "\r\n" for s in src).encode())
    (tmp_path / "e.de").write_bytes(
        "".join(t + "\r\n" for t in tgt[:-1]).encode() + tgt[-1].encode()
    )  # no final newline
    dirty = load_parallel(
        tmp_path / "e.en", tmp_path / "e.de", tok, tok, DataConfig(), cache_dir=tmp_path / "c2", quiet=True
    )
    assert dirty.num_pairs == clean.num_pairs == 20
    for i in range(20):
        assert [a.tolist() for a in dirty.pair(i)] == [a.tolist() for a in clean.pair(i)]


# --------------------------------------------------------------------------- the cache


def test_cache_holds_the_tokenizer_ids_and_second_load_reads_it(tmp_path, corpus_slice, tok, monkeypatch):
    cfg = DataConfig()
    src_lines, tgt_lines = head(corpus_slice["train.en"], 2000), head(corpus_slice["train.de"], 2000)
    monkeypatch.setattr(data, "CHUNK_LINES", 300)  # several chunks: offsets must carry across them
    first = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, cfg, cache_dir=tmp_path, quiet=True
    )
    assert not first.summary.from_cache

    def no_encoding(*args, **kwargs):
        raise AssertionError("the second load re-encoded the corpus")

    monkeypatch.setattr(data, "_encode_corpus", no_encoding)
    d = load_parallel(corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, cfg, cache_dir=tmp_path, quiet=True)
    assert d.summary.from_cache and d.summary.kept == first.summary.kept
    expected = naive_filter(src_lines, tgt_lines, tok, cfg)
    assert d.line_numbers.tolist() == expected["kept"] and d.summary.dropped_ratio == expected["ratio"]
    src_ids = tok.encode([src_lines[i] for i in expected["kept"]])
    tgt_ids = tok.encode([tgt_lines[i] for i in expected["kept"]])
    for i in range(d.num_pairs):
        s, t = d.pair(i)
        assert s.tolist() == src_ids[i] and t.tolist() == tgt_ids[i]
    assert d.src_lengths.tolist() == [len(x) for x in src_ids]
    files = {p.name: p.stat().st_size for p in d.directory.iterdir()}
    assert files["src.tokens"] == 2 * sum(map(len, src_ids))  # uint16 for a 1000-piece vocabulary
    assert files["src.offsets"] == files["lines"] == 8 * d.num_pairs and files["tgt.lengths"] == 4 * d.num_pairs


def test_cache_is_invalidated_by_data_tokenizer_and_settings(tmp_path, corpus_slice, tok, tmp_path_factory):
    src = shutil.copy(corpus_slice["val.en"], tmp_path / "v.en")
    tgt = shutil.copy(corpus_slice["val.de"], tmp_path / "v.de")
    cache = tmp_path / "cache"
    a = load_parallel(src, tgt, tok, tok, DataConfig(), cache_dir=cache, quiet=True)
    assert load_parallel(src, tgt, tok, tok, DataConfig(), cache_dir=cache, quiet=True).summary.from_cache

    lines = head(tgt, 100)
    lines[5] = "Ein völlig anderer Satz über einen Hund."
    write(Path(tgt), lines)
    b = load_parallel(src, tgt, tok, tok, DataConfig(), cache_dir=cache, quiet=True)
    assert not b.summary.from_cache and b.directory != a.directory
    assert b.pair(5)[1].tolist() == tok.encode([lines[5]])[0] != a.pair(5)[1].tolist()

    other = Tokenizer(
        train_sentencepiece([corpus_slice["train.de"]], tmp_path_factory.mktemp("spm2") / "de", vocab_size=600)
    )
    c = load_parallel(src, tgt, tok, other, DataConfig(), cache_dir=cache, quiet=True)
    assert not c.summary.from_cache and c.pair(5)[1].tolist() == other.encode([lines[5]])[0]
    d = load_parallel(src, tgt, tok, tok, DataConfig(max_len=10), cache_dir=cache, quiet=True)
    assert not d.summary.from_cache and d.num_pairs < b.num_pairs
    assert load_parallel(
        src, tgt, tok, tok, DataConfig(), cache_dir=cache, quiet=True
    ).summary.from_cache  # b's cache is still there


def test_cache_is_found_from_another_working_directory(tmp_path, corpus_slice, tok, monkeypatch):
    shutil.copy(corpus_slice["val.en"], tmp_path / "w.en")
    shutil.copy(corpus_slice["val.de"], tmp_path / "w.de")
    monkeypatch.chdir(tmp_path)
    a = load_parallel("w.en", "w.de", tok, tok, DataConfig(), cache_dir="cache", quiet=True)
    monkeypatch.chdir(tmp_path.parent)
    b = load_parallel(
        tmp_path / "w.en", tmp_path / "w.de", tok, tok, DataConfig(), cache_dir=tmp_path / "cache", quiet=True
    )
    assert b.summary.from_cache and b.directory.name == a.directory.name
    assert b.texts("src")[:3] == head(corpus_slice["val.en"], 3)  # paths as given now, not as when written


def test_crash_mid_encode_leaves_no_valid_looking_cache(tmp_path, corpus_slice, tok, monkeypatch):
    monkeypatch.setattr(data, "CHUNK_LINES", 500)
    calls = []

    class Failing(Tokenizer):
        def encode(self, lines: list[str], *, alpha: float = 0.0, nbest: int = -1) -> list[list[int]]:
            calls.append(len(lines))
            if len(calls) == 3:  # second chunk, source side already written
                raise KeyboardInterrupt
            return super().encode(lines, alpha=alpha, nbest=nbest)

    bad = Failing(tok.proto)
    with pytest.raises(KeyboardInterrupt):
        load_parallel(
            corpus_slice["train.en"], corpus_slice["train.de"], bad, bad, DataConfig(), cache_dir=tmp_path, quiet=True
        )
    assert list(tmp_path.iterdir()) == []
    d = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    assert not d.summary.from_cache and d.summary.pairs_read == 2000

    # A damaged cache (a truncated token file) is detected by its size and rebuilt.
    last = d.pair(d.num_pairs - 1)[1].tolist()
    directory = d.directory
    del d  # unmap before damaging the file
    tokens = directory / "tgt.tokens"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    e = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    assert not e.summary.from_cache and e.directory == directory and e.pair(e.num_pairs - 1)[1].tolist() == last
