"""Reading, validation, the encoded-corpus cache, token-budget batches and the Batch, on real Multi30k."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TypedDict

import numpy as np
import pytest
import torch

from tests.conftest import head
from transformer_mt.config import DataConfig
from transformer_mt.data import DataError, SampledSegmentation, collate, load_parallel, make_batches, shard
from transformer_mt.data import corpus as data
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, TextError, Tokenizer, train_sentencepiece


@pytest.fixture(scope="module")
def tok(spm_model) -> Tokenizer:
    return Tokenizer(spm_model)


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


# --------------------------------------------------------------------------- batching


def test_batches_respect_budget_and_cover_each_pair_once(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    ls, lt = d.src_lengths + 1, d.tgt_lengths + 1  # EOS / BOS
    for max_tokens in (200, 1000):
        batches = d.batches(3, max_tokens=max_tokens, seed=7)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(d.num_pairs))
        pad = real = 0
        for idx in batches:
            assert len(idx) * max(ls[idx].max(), lt[idx].max()) <= max_tokens
            b = d.get_batch(idx)
            assert b.src.numel() <= max_tokens and b.tgt_in.numel() <= max_tokens
            pad += int((b.tgt_out == PAD_ID).sum())
            real += b.ntokens
        assert pad / (pad + real) < 0.02  # sorted by target length: almost no target padding

    # Greedy and maximal: without shuffling, the first pair of each batch would not fit into the previous one.
    batches = make_batches(ls, lt, 500, seed=7, epoch=0, shuffle=False)
    for prev, nxt in zip(batches, batches[1:]):
        grown = np.append(prev, nxt[0])
        assert len(grown) * max(ls[grown].max(), lt[grown].max()) > 500
    assert [lt[b].max() for b in batches] == sorted(lt[b].max() for b in batches)


def test_batch_order_is_a_function_of_seed_and_epoch(tmp_path, corpus_slice, tok):
    args = (corpus_slice["train.en"], corpus_slice["train.de"], tok, tok, DataConfig())
    d1 = load_parallel(*args, cache_dir=tmp_path, quiet=True)
    d2 = load_parallel(*args, cache_dir=tmp_path, quiet=True)  # a resumed run: a fresh object
    same = lambda a, b: len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))  # noqa: E731
    e1 = d1.batches(1, max_tokens=800, seed=3)
    assert same(e1, d2.batches(1, max_tokens=800, seed=3))
    assert same(e1[5:], d2.batches(1, max_tokens=800, seed=3)[5:])
    e2 = d1.batches(2, max_tokens=800, seed=3)
    assert not same(e1, e2) and [b[0] for b in e1[:10]] != [b[0] for b in e2[:10]]
    assert not same(e1, d1.batches(1, max_tokens=800, seed=4))
    assert not same(d1.batches(1, max_tokens=800, seed=2), d1.batches(2, max_tokens=800, seed=1))  # not seed + epoch


def test_batches_equal_a_naive_greedy_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 400))
        ls, lt = rng.integers(1, 80, n), rng.integers(1, int(rng.integers(2, 80)), n)
        max_tokens = int(rng.integers(1, 600))
        order = sorted(range(n), key=lambda i: (lt[i], ls[i], i))
        want: list[list[int]] = []
        current: list[int] = []
        for i in order:  # add while max(len) x count stays within budget on both sides
            grown = current + [i]
            if current and len(grown) * max(max(ls[grown]), max(lt[grown])) > max_tokens:
                want.append(current)
                grown = [i]
            current = grown
        want.append(current)
        got = make_batches(ls, lt, max_tokens, seed=5, epoch=0, shuffle=False)
        assert [b.tolist() for b in got] == want


def test_single_pair_over_budget_gets_its_own_batch_and_shard():
    batches = make_batches([30, 2, 2, 2], [2, 2, 2, 3], 8, seed=0, epoch=0, shuffle=False)
    # sorted by (target, source) length: 1, 2, 0, 3; pair 0 (30 tokens > 8) stands alone
    assert [b.tolist() for b in batches] == [[1, 2], [0], [3]]
    items = list(range(10))
    assert [shard(items, r, 3) for r in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert shard(items, 0, 3, drop_remainder=False) == [0, 3, 6, 9]
    with pytest.raises(ValueError):
        shard(items, 3, 3)
    assert make_batches([], [], 10, seed=0, epoch=0) == []


# --------------------------------------------------------------------------- the Batch


def test_collate_builds_teacher_forcing_in_one_place():
    b = collate([([5, 6, 7], [10]), ([8], [11, 12, 13])], indices=[4, 9])
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 10, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[10, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, EOS_ID]]
    assert b.indices is not None
    assert (b.ntokens, b.nsentences, b.indices.tolist()) == (6, 2, [4, 9])
    assert b.src.dtype == b.tgt_in.dtype == b.tgt_out.dtype == torch.long
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out) and moved.ntokens == 6


def test_get_batch_rows_match_the_pairs(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["val.en"],
        corpus_slice["val.de"],
        tok,
        tok,
        DataConfig(),
        cache_dir=tmp_path,
        filter_long=False,
        quiet=True,
    )
    idx = d.batches(1, max_tokens=600, seed=1)[0]
    b = d.get_batch(idx)
    assert b.indices is not None
    assert b.nsentences == len(idx) and b.indices.tolist() == idx.tolist()
    assert b.ntokens == int((d.tgt_lengths[idx] + 1).sum()) == int((b.tgt_out != PAD_ID).sum())
    for row, i in enumerate(idx):
        s, t = (x.tolist() for x in d.pair(i))
        assert b.src[row].tolist() == s + [EOS_ID] + [PAD_ID] * (b.src.size(1) - len(s) - 1)
        assert b.tgt_in[row].tolist() == [BOS_ID] + t + [PAD_ID] * (b.tgt_in.size(1) - len(t) - 1)
        assert b.tgt_out[row].tolist() == t + [EOS_ID] + [PAD_ID] * (b.tgt_out.size(1) - len(t) - 1)
        assert torch.equal(b.tgt_in[row, 1 : len(t) + 1], b.tgt_out[row, : len(t)])  # labels = input shifted left


# --------------------------------------------------------------------------- subword regularisation


def _segmentation(s: SampledSegmentation) -> list[tuple[list[int], list[int]]]:
    return [tuple(x.tolist() for x in s.pair(i)) for i in range(s.num_pairs)]


def test_sampled_segmentation_is_a_seeded_resegmentation_of_the_same_text(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=100),
        cache_dir=tmp_path,
        quiet=True,
    )
    best = [tuple(x.tolist() for x in d.pair(i)) for i in range(d.num_pairs)]
    s = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=5, max_len=100)
    assert _segmentation(s) == best  # before the first epoch: the cached best segmentation
    s.batches(1, max_tokens=800, seed=5)
    e1 = _segmentation(s)
    for side in (0, 1):  # the same text, other pieces
        assert tok.decode([p[side] for p in e1]) == tok.decode([p[side] for p in best])
        changed = sum(a[side] != b[side] for a, b in zip(e1, best)) / len(best)
        assert changed > 0.5, f"alpha 0.3 re-segments most sentences, side {side}: {changed:.2f}"
    assert s.last_stats["tgt_piece_ratio"] > 1.02 and s.last_stats["epoch"] == 1
    assert np.array_equal(s.tgt_lengths, [len(p[1]) for p in e1])

    again = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=5, max_len=100)  # a resumed run, another rank
    again.batches(1, max_tokens=800, seed=5)
    assert _segmentation(again) == e1
    s.batches(2, max_tokens=800, seed=5)
    e2 = _segmentation(s)
    assert sum(a != b for a, b in zip(e1, e2)) > 0.5 * len(e1)
    other = SampledSegmentation(d, tok, tok, alpha=0.3, nbest=-1, seed=6, max_len=100)
    other.batches(1, max_tokens=800, seed=5)
    assert sum(a != b for a, b in zip(e1, _segmentation(other))) > 0.5 * len(e1)
    s.batches(1, max_tokens=800, seed=5)  # back to epoch 1 (resuming there): the same pieces again
    assert _segmentation(s) == e1


def test_sampled_batches_cover_each_pair_once_within_budget(tmp_path, corpus_slice, tok):
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=100),
        cache_dir=tmp_path,
        quiet=True,
    )
    s = SampledSegmentation(d, tok, tok, alpha=0.2, nbest=-1, seed=1, max_len=100)
    batches = s.batches(3, max_tokens=600, seed=1)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(d.num_pairs))
    for idx in batches:
        b = s.get_batch(idx)
        assert b.src.numel() <= 600 and b.tgt_in.numel() <= 600
        for row, i in enumerate(idx[:3]):
            src, tgt = (x.tolist() for x in s.pair(int(i)))
            assert b.src[row, : len(src) + 1].tolist() == src + [EOS_ID]
            assert b.tgt_in[row, : len(tgt) + 1].tolist() == [BOS_ID] + tgt
            assert b.tgt_out[row, : len(tgt) + 1].tolist() == tgt + [EOS_ID]


def test_sampled_pairs_over_max_len_keep_their_best_segmentation(tmp_path, corpus_slice, tok):
    limit = 20
    d = load_parallel(
        corpus_slice["train.en"],
        corpus_slice["train.de"],
        tok,
        tok,
        DataConfig(max_len=limit),
        cache_dir=tmp_path,
        quiet=True,
    )
    capped = SampledSegmentation(d, tok, tok, alpha=0.1, nbest=-1, seed=3, max_len=limit)
    free = SampledSegmentation(d, tok, tok, alpha=0.1, nbest=-1, seed=3, max_len=10_000)  # the same draws, no cap
    capped.segment(1)
    free.segment(1)
    over = [i for i in range(d.num_pairs) if max(len(x) for x in free.pair(i)) > limit]
    assert len(over) > 10, "alpha 0.1 lengthens some pairs past the cap"
    assert max(capped.src_lengths.max(), capped.tgt_lengths.max()) <= limit
    for i in over:
        sampled, best = free.pair(i), d.pair(i)
        for side in (0, 1):
            expected = best[side] if len(sampled[side]) > limit else sampled[side]
            assert capped.pair(i)[side].tolist() == expected.tolist()


def test_bpe_models_sample_by_dropping_merges(tmp_path, corpus_slice):
    bpe = Tokenizer(
        train_sentencepiece(
            [corpus_slice["train.en"], corpus_slice["train.de"]], tmp_path / "bpe", vocab_size=1000, model_type="bpe"
        )
    )
    d = load_parallel(
        corpus_slice["val.en"], corpus_slice["val.de"], bpe, bpe, DataConfig(), cache_dir=tmp_path, quiet=True
    )
    s = SampledSegmentation(d, bpe, bpe, alpha=0.1, nbest=-1, seed=1, max_len=256)
    s.segment(1)
    e1 = _segmentation(s)
    best = [tuple(x.tolist() for x in d.pair(i)) for i in range(d.num_pairs)]
    assert sum(a != b for a, b in zip(e1, best)) > 0.3 * len(best)
    assert bpe.decode([p[1] for p in e1]) == bpe.decode([p[1] for p in best])
