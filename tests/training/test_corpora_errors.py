"""Bad data.corpora and data.valid: each is one line through `tmt train` (exit 2, no traceback) naming the key or the
corpus, before any tokenizer is trained or any pair encoded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.data.multicorpus import corpus_files, tagged_tokenizer


@pytest.fixture(scope="module")
def files(multi30k, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bad_corpora")
    out = corpus_files(multi30k, root, pairs=60, bt_pairs=20, valid=6)
    short = root / "short.fr"  # one line fewer than train.en
    short.write_text("".join(out["train.fr"].read_text(encoding="utf-8").splitlines(keepends=True)[:-1]))
    out["short.fr"] = short
    out["spm"] = tagged_tokenizer(out, root, vocab_size=300)
    return out


def corpus(name: str, src: Path | str, tgt: Path | str, **keys: object) -> str:
    extra = "".join(f", {k}: {v}" for k, v in keys.items())
    return f"{{name: {name}, src: {src}, tgt: {tgt}{extra}}}" if name else f"{{src: {src}, tgt: {tgt}{extra}}}"


def _cases(f: dict, spm_model: Path) -> list[tuple[str, list[str], str]]:
    de = corpus("en-de", f["train.en"], f["train.de"], tgt_lang="de")
    fr = corpus("en-fr", f["train.en"], f["train.fr"], tgt_lang="fr")
    val_de = f"{{src: {f['val.en']}, tgt: {f['val.de']}, tgt_lang: de}}"
    return [
        ("missing-file", [f"data.corpora=[{de}, {corpus('en-fr', f['train.en'], str(f['val.en']) + '.nope')}]"],
         "data.corpora[1].tgt: file"),
        ("line-counts", [f"data.corpora=[{de}, {corpus('en-fr', f['train.en'], f['short.fr'], tgt_lang='fr')}]"],
         f"data.corpora[1] (en-fr): {f['train.en']} has 60 lines but {f['short.fr']} has 59"),
        ("weight-zero", [f"data.corpora=[{de}, {corpus('en-fr', f['train.en'], f['train.fr'], weight=0)}]"],
         "data.corpora[1].weight: 0 is not positive"),
        ("weight-negative", [f"data.corpora=[{corpus('en-de', f['train.en'], f['train.de'], weight=-2)}]"],
         "data.corpora[0].weight: -2 is not positive"),
        ("duplicate-names", [f"data.corpora=[{de}, {corpus('en-de', f['train.en'], f['train.fr'])}]"],
         "data.corpora[1].name: 'en-de' is also the name of the corpus at index 0"),
        ("empty-name", [f"data.corpora=[{de}, {corpus('', f['train.en'], f['train.fr'])}]"],
         "data.corpora[1].name: is empty"),
        ("language-without-valid", [f"data.corpora=[{de}, {fr}]", f"data.valid=[{val_de}]"],
         "data.valid: no set has tgt_lang 'fr'"),
        ("valid-language-not-trained", [f"data.corpora=[{de}, {fr}]",
         f"data.valid=[{val_de}, {{src: {f['val.en']}, tgt: {f['val.fr']}, tgt_lang: cs}}]"],
         "data.valid[1].tgt_lang: is 'cs', not a target language of the corpora"),
        ("bad-language-code", [f"data.corpora=[{corpus('en-de', f['train.en'], f['train.de'], tgt_lang='German')}]"],
         "data.corpora[0].tgt_lang: 'German' is not a language code"),
        ("bad-source-code", [f"data.corpora=[{corpus('en-de', f['train.en'], f['train.de'], src_lang='e')}]"],
         "data.corpora[0].src_lang: 'e' is not a language code"),
        ("bad-tag", [f"data.corpora=[{de}, {corpus('bt', f['bt.en'], f['bt.de'], tgt_lang='de', tag='BT')}]"],
         "data.corpora[1].tag: 'BT' is not a tag"),
        ("shorthand-and-corpora", [f"data.corpora=[{de}]", f"data.train_src={f['train.en']}"],
         "data.train_src: is given beside data.corpora"),
        ("valid-twice", [f"data.corpora=[{de}]", f"data.valid=[{val_de}]", f"data.valid_src={f['val.en']}",
         f"data.valid_tgt={f['val.de']}"], "data.valid_src: is given beside data.valid"),
        ("multilingual-without-tgt-lang",
         [f"data.corpora=[{de}, {fr}, {corpus('more', f['bt.en'], f['bt.de'])}]"],
         "data.corpora[2].tgt_lang: is empty while other corpora name target languages (de, fr)"),
        ("tag-not-in-given-tokenizer", [f"data.corpora=[{de}, {fr}]", f"tokenizer.model={spm_model}"],
         f"data.corpora[0] (en-de) with tokenizer.model {spm_model}: the tokenizer has no piece <2de>"),
        ("nothing-left", [f"data.corpora=[{de}, {fr}]", "data.max_len=2"],
         "data.corpora[0] (en-de): no training pairs left after filtering"),
    ]  # fmt: skip


CASES = [
    "missing-file",
    "line-counts",
    "weight-zero",
    "weight-negative",
    "duplicate-names",
    "empty-name",
    "language-without-valid",
    "valid-language-not-trained",
    "bad-language-code",
    "bad-source-code",
    "bad-tag",
    "shorthand-and-corpora",
    "valid-twice",
    "multilingual-without-tgt-lang",
    "tag-not-in-given-tokenizer",
    "nothing-left",
]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_corpus_setting_is_one_line_through_tmt_train(case, files, spm_model, tmp_path, capsys) -> None:
    (sets, expected) = next((s, e) for name, s, e in _cases(files, spm_model) if name == case)
    config = tmp_path / "tiny.yaml"  # a tiny model that would train one update, were the data right
    config.write_text(
        "model: {encoder_layers: 1, decoder_layers: 1, d_model: 16, heads: 2, d_ff: 32}\n"
        f"train: {{out_dir: {tmp_path / 'run'}, device: cpu, threads: 1, max_updates: 1, max_tokens: 400}}\n",
        encoding="utf-8",
    )
    argv = ["train", "--config", str(config)]
    if not any(s.startswith("tokenizer.model=") for s in sets):
        argv += ["--set", f"tokenizer.model={files['spm']}"]
    for item in sets:
        argv += ["--set", item]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("tmt: error:")]
    assert len(lines) == 1 and expected in lines[0], err
    assert not (tmp_path / "run" / "cache").exists() or case in ("line-counts", "nothing-left")


def test_the_table_covers_every_case() -> None:
    assert len(CASES) == len({name for name, _, _ in _cases({k: Path(k) for k in _KEYS}, Path("spm"))})


_KEYS = ("train.en", "train.de", "train.fr", "bt.en", "bt.de", "val.en", "val.de", "val.fr", "short.fr", "spm")
