"""A run's corpora read from its config (data.load_datasets): each corpus in a cache of its own, its sources starting
with its tags' ids, data.filters applied to its raw pairs and counted, and its cache key covering tags and filters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import head, run_cli
from tests.data.multicorpus import corpora_override, corpus_files, tagged_tokenizer, valid_override
from transformer_mt.config import load_config
from transformer_mt.data import load_datasets
from transformer_mt.errors import TmtError
from transformer_mt.text import Tokenizer


@pytest.fixture(scope="module")
def files(multi30k, tmp_path_factory) -> dict:
    return corpus_files(multi30k, tmp_path_factory.mktemp("corpora"), pairs=200, bt_pairs=60, valid=8)


@pytest.fixture(scope="module")
def tagged_path(files, tmp_path_factory) -> Path:
    return tagged_tokenizer(files, tmp_path_factory.mktemp("tagged_spm"), vocab_size=500)


@pytest.fixture(scope="module")
def tagged(tagged_path) -> Tokenizer:
    return Tokenizer(tagged_path)


def _config(files: dict, tok_path, out, *extra: str):
    return load_config(
        None,
        [corpora_override(files), valid_override(files), f"tokenizer.model={tok_path}", f"train.out_dir={out}", *extra],
    )


def test_each_source_starts_with_its_tags_ids_and_each_corpus_has_its_cache(
    files, tagged_path, tagged, tmp_path
) -> None:
    cfg = _config(files, tagged_path, tmp_path)
    sets = load_datasets(cfg, tagged, tagged, quiet=True)
    de, fr, bt = (tagged.sp.piece_to_id(t) for t in ("<2de>", "<2fr>", "<BT>"))
    expected = {"en-de": [de], "en-fr": [fr], "bt": [de, bt]}
    assert [s.name for s in sets.train] == ["en-de", "en-fr", "bt"] and not sets.shorthand
    for one in sets.train:
        prefix = expected[one.name]
        assert one.data.src_prefix == prefix
        lines = head(Path(one.config.src), 3)
        for i in range(3):
            src, tgt = one.data.pair(i)
            assert src.tolist() == prefix + tagged.encode([lines[i].strip()])[0]  # the tag ids, then the text's
    assert len({one.data.directory for one in sets.train}) == 3
    # en-de and en-fr read the same source file: with other tags, other caches
    assert sets.train[0].data.directory != sets.train[1].data.directory
    # a validation set's sources start with its target language's tag, and are not length-filtered
    assert [(v.name, v.src_prefix) for v in sets.valid] == [("en-de", [de]), ("en-fr", [fr])]
    assert sets.valid[1].data.pair(0)[0].tolist()[:1] == [fr] and not sets.valid[0].data.summary.filtered


def test_a_tag_the_tokenizer_lacks_is_one_line_naming_the_corpus(files, spm_model, tmp_path) -> None:
    tok = Tokenizer(spm_model)  # trained without the tags
    cfg = _config(files, spm_model, tmp_path)
    with pytest.raises(TmtError) as err:
        load_datasets(cfg, tok, tok, quiet=True)
    message = str(err.value)
    assert message.startswith("data.corpora[0] (en-de)") and "<2de>" in message and "user-defined symbol" in message
    assert "\n" not in message


def test_filters_drop_raw_pairs_and_are_counted_and_keyed(files, tagged, tmp_path) -> None:
    src, tgt = tmp_path / "dup.en", tmp_path / "dup.de"
    en, de = head(files["train.en"], 40), head(files["train.de"], 40)
    lines = [(en[i % 30], de[i % 30]) for i in range(40)] + [("Same text.", "Same text.")]  # 10 repeats, 1 copy
    src.write_text("".join(s + "\n" for s, _ in lines), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in lines), encoding="utf-8")
    base = [f"data.train_src={src}", f"data.train_tgt={tgt}", f"train.out_dir={tmp_path}"]
    plain = load_datasets(load_config(None, base), tagged, tagged, quiet=True).train[0].data
    assert plain.num_pairs == 41 and not plain.summary.cleaned
    rules = ["data.filters.duplicates=exact", "data.filters.identical=true"]
    cleaned = load_datasets(load_config(None, [*base, *rules]), tagged, tagged, quiet=True).train[0].data
    distinct = len(dict.fromkeys(lines)) - 1  # repeats and the untranslated copy go
    assert cleaned.num_pairs == distinct == 30
    assert cleaned.summary.dropped_filtered == 11 and cleaned.summary.filtered_by == {
        "exact_duplicate": 10,
        "identical": 1,
    }
    assert cleaned.directory != plain.directory  # the rules are part of the key
    assert "11 by data.filters (exact_duplicate 10, identical 1)" in cleaned.summary.format()
    assert cleaned.line_numbers.tolist() == list(range(30))  # the first of each pair is kept
    again = load_datasets(load_config(None, [*base, *rules]), tagged, tagged, quiet=True).train[0].data
    assert again.summary.from_cache and again.summary.filtered_by == cleaned.summary.filtered_by


def test_preprocess_encodes_every_corpus_and_set_once(files, tagged_path, tmp_path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "data:\n"
        f"  corpora: [{corpora_override(files).split('=', 1)[1][1:-1]}]\n"
        f"  valid: [{valid_override(files).split('=', 1)[1][1:-1]}]\n"
        f"tokenizer: {{model: {tagged_path}}}\n"
        f"train: {{out_dir: {tmp_path / 'run'}}}\n",
        encoding="utf-8",
    )
    code, out, err = run_cli(["preprocess", "-c", config], capsys)
    assert code == 0, err
    names = [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]
    assert names == ["en-de", "en-fr", "bt", "en-de", "en-fr"] and out.count("(written)") == 5
    code, out, err = run_cli(["preprocess", "-c", config], capsys)
    assert code == 0 and out.count("(loaded)") == 5, err
