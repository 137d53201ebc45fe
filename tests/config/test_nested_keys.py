"""Nested config keys: data.corpora and data.valid as lists of records, data.filters as one record."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_mt.config import ConfigError, CorpusConfig, from_dict, load_config, to_dict


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_corpora_list_is_typed_and_round_trips(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "data:\n"
        "  corpora:\n"
        "    - {name: de, src: a.en, tgt: a.de, weight: 2, src_lang: en, tgt_lang: de}\n"
        "    - name: bt\n"
        "      src: b.en\n"
        "      tgt: b.de\n"
        "      tag: <BT>\n"
        "  filters: {duplicates: exact, langid: true}\n",
    )
    cfg = load_config(path, check_files=False)
    assert cfg.data.corpora == [
        CorpusConfig(name="de", src="a.en", tgt="a.de", weight=2.0, src_lang="en", tgt_lang="de"),
        CorpusConfig(name="bt", src="b.en", tgt="b.de", tag="<BT>"),
    ]
    assert isinstance(cfg.data.corpora[0].weight, float)
    assert cfg.data.filters.duplicates == "exact" and cfg.data.filters.langid is True
    assert cfg.data.filters.max_words == 0  # unstated keys of a record keep their defaults
    assert from_dict(to_dict(cfg)) == cfg


def test_set_reaches_into_a_nested_record() -> None:
    cfg = load_config(None, ["data.filters.max_words=80", "data.filters.identical=true"], check_files=False)
    assert cfg.data.filters.max_words == 80 and cfg.data.filters.identical is True
    assert cfg.data.filters.duplicates == "off"


def test_yaml_off_is_the_word_for_a_choice(tmp_path: Path) -> None:
    path = _write(tmp_path, "train: {compile: off, packed: on}\ndata:\n  filters: {duplicates: off}\n")
    cfg = load_config(path, check_files=False)
    assert (cfg.train.compile, cfg.train.packed, cfg.data.filters.duplicates) == ("off", "on", "off")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.corpora=[{nme: x}]", "data.corpora[0]: unknown key 'nme'; did you mean 'name'?"),
        ("data.corpora=[{weight: abc}]", "data.corpora[0].weight: expected a number, got 'abc'"),
        ("data.corpora=3", "data.corpora: expected a list of {name, src, tgt, weight, src_lang, tgt_lang, tag}"),
        ("data.corpora=[7]", "data.corpora[0]: expected a mapping {name, src,"),
        ("data.filters.nope=1", "data.filters: unknown key 'nope'"),
        ("data.valid_src.x=1", "data.valid_src: has no keys inside it"),
        ("data.filters.duplicates=fuzzy", "data.filters.duplicates: 'fuzzy' is not one of off, exact, normalized"),
        ("train.compile=fast", "train.compile: 'fast' is not one of auto, on, aot_eager, off"),
        ("data.sampling_temperature=-1", "data.sampling_temperature: -1 is negative"),
    ],
)
def test_bad_nested_values_are_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override], check_files=False)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_list_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = _write(tmp_path, "data:\n  valid: [" + ", ".join(["{}"] * 10_001) + "]\n")
    with pytest.raises(ConfigError, match=r"data.valid: 10,001 entries; give at most 10000"):
        load_config(path, check_files=False)
