"""Several real corpora for the tests of data.corpora: slices of Multi30k en -> de, en -> fr and a "back-translated"
en -> de slice of other lines, their validation pairs, and a tokenizer over en, de and fr that holds the run's tags
(<2de>, <2fr>, <BT>) as user-defined symbols."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import head

TAGS = ("<2de>", "<2fr>", "<BT>")


def corpus_files(multi30k: Path, root: Path, *, pairs: int = 300, bt_pairs: int = 120, valid: int = 16) -> dict:
    """Files under ``root``: train.{en,de,fr} (the first ``pairs`` lines), bt.{en,de} (``bt_pairs`` lines from line
    5000 on) and val.{en,de,fr} (the first ``valid`` lines); returned by name ("train.en", ...)."""
    root.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, source, n, skip in (
        ("train", "train", pairs, 0),
        ("bt", "train", bt_pairs, 5000),
        ("val", "val", valid, 0),
    ):
        for lang in ("en", "de", "fr"):
            if name == "bt" and lang == "fr":
                continue
            path = root / f"{name}.{lang}"
            path.write_text("\n".join(head(multi30k / f"{source}.{lang}", n, skip=skip)) + "\n", encoding="utf-8")
            files[f"{name}.{lang}"] = path
    return files


def tagged_tokenizer(files: dict, root: Path, *, vocab_size: int = 600) -> Path:
    """A joint unigram model over the en, de and fr training files with TAGS as user-defined symbols."""
    from transformer_mt.text import train_sentencepiece

    return train_sentencepiece(
        [files["train.en"], files["train.de"], files["train.fr"]],
        root / "tagged",
        vocab_size=vocab_size,
        user_defined_symbols=list(TAGS),
    )


def corpora_override(files: dict, *, fr_weight: float = 1.0, bt: bool = True) -> str:
    """--set data.corpora=[...]: en-de (tgt_lang de), en-fr (fr, weight ``fr_weight``) and, with ``bt``, bt (de, tag
    <BT>, weight 0.5): a multilingual run whose sources start with <2de> / <2fr>, the bt ones then <BT>."""
    entries = [
        f"{{name: en-de, src: {files['train.en']}, tgt: {files['train.de']}, src_lang: en, tgt_lang: de}}",
        f"{{name: en-fr, src: {files['train.en']}, tgt: {files['train.fr']}, src_lang: en, tgt_lang: fr, "
        f"weight: {fr_weight}}}",
    ]
    if bt:
        entries.append(
            f"{{name: bt, src: {files['bt.en']}, tgt: {files['bt.de']}, src_lang: en, tgt_lang: de, tag: <BT>, "
            "weight: 0.5}"
        )
    return "data.corpora=[" + ", ".join(entries) + "]"


def valid_override(files: dict) -> str:
    """--set data.valid=[...]: en-de and en-fr validation sets (named by their languages)."""
    return (
        f"data.valid=[{{src: {files['val.en']}, tgt: {files['val.de']}, src_lang: en, tgt_lang: de}}, "
        f"{{src: {files['val.en']}, tgt: {files['val.fr']}, src_lang: en, tgt_lang: fr}}]"
    )
