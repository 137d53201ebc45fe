"""`tmt clean` end to end: the kept pairs, the dropped TSV and the report on a crafted corpus, outputs replaced only on
success, bad inputs as one line with exit code 2, and a run over Multi30k en-de."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import run_cli
from transformer_mt.cleaning import CleaningError, CleanOutputs, clean_files
from transformer_mt.config import FiltersConfig

# (source, target, the rule that must drop it or None) with the flags of RULE_FLAGS; near-misses stay
CRAFTED = [
    ("Two dogs run outside.", "Zwei Hunde rennen draußen.", None),
    ("3 cats sleep.", "3 Katzen schlafen.", None),
    ("", "Leer.", "empty"),
    ("4 Cats sleep", "4 Katzen schlafen", "normalized_duplicate"),
    ("Ça va bien, merci.", "Ça va bien, merci.", "identical"),
    ("Ça va", "Es geht", None),  # letters, with a cedilla
    ("one two three four five six", "eins zwei drei vier fünf sechs", "too_many_words"),
    ("A man with a hat", "Ein Mann mit Hut", None),
    ("A man with red hat", "Mann", "length_ratio"),  # 5 words against 1
    ("A price tag says", "€ 12,50 = 4,17!", "nonletter"),
    ("A dog runs fast.", "Собака бежит быстро.", "wrong_script"),
    ("I love Moscow", "Ich liebe Москва sehr", None),  # mostly Latin: a name in Cyrillic stays
    ("Two  dogs RUN outside ", "Zwei Hunde rennen draußen!", "normalized_duplicate"),
    ("Tabs\tand \\ here now", "x", "length_ratio"),  # the TSV escapes its tab and backslash
]
RULE_FLAGS = [
    "--duplicates",
    "normalized",
    "--identical",
    "--max-words",
    "5",
    "--max-ratio",
    "3",
    "--max-nonletter",
    "0.5",
    "--script",
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def crafted(tmp_path) -> tuple[Path, Path]:
    return write(tmp_path / "raw.en", [s for s, _, _ in CRAFTED]), write(
        tmp_path / "raw.de", [t for _, t, _ in CRAFTED]
    )


def test_clean_drops_exactly_the_crafted_pairs(crafted, tmp_path, capsys):
    src, tgt = crafted
    code, out, err = run_cli(
        ["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "out", *RULE_FLAGS], capsys
    )
    assert code == 0, err
    kept = [(s, t) for s, t, rule in CRAFTED if rule is None]
    assert (tmp_path / "out.en").read_text(encoding="utf-8").splitlines() == [s for s, _ in kept]
    assert (tmp_path / "out.de").read_text(encoding="utf-8").splitlines() == [t for _, t in kept]

    rows = (tmp_path / "out.dropped.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "rule\tline\tsource\ttarget"
    escape = str.maketrans({"\\": "\\\\", "\t": "\\t"})
    expected_rows = [
        f"{rule}\t{i}\t{s.translate(escape)}\t{t.translate(escape)}"
        for i, (s, t, rule) in enumerate(CRAFTED, start=1)
        if rule is not None
    ]
    assert rows[1:] == expected_rows
    assert rows[-1] == "length_ratio\t14\tTabs\\tand \\\\ here now\tx"

    report = json.loads((tmp_path / "out.report.json").read_text(encoding="utf-8"))
    dropped = [rule for _, _, rule in CRAFTED if rule is not None]
    assert report["read"] == len(CRAFTED) and report["kept"] == len(kept)
    assert report["dropped"] == {rule: dropped.count(rule) for rule in report["rules"]}
    assert report["kept"] + sum(report["dropped"].values()) == report["read"]
    assert report["rules"] == [
        "empty",
        "normalized_duplicate",
        "identical",
        "too_many_words",
        "length_ratio",
        "nonletter",
        "wrong_script",
    ]
    assert report["filters"]["max_ratio"] == 3.0 and report["src_lang"] == "en"
    share = f"{100 * len(kept) / len(CRAFTED):.1f}%"
    assert out.splitlines()[0] == f"read {len(CRAFTED)} pairs, kept {len(kept)} ({share}), dropped {len(dropped)}"
    assert "  normalized_duplicate  2" in out.splitlines()


def test_duplicates_across_chunks_keep_their_line_numbers(tmp_path):
    pairs = [(f"Sentence {i % 4} here.", f"Satz {i % 4} hier.") for i in range(11)]
    src, tgt = write(tmp_path / "a.en", [s for s, _ in pairs]), write(tmp_path / "a.de", [t for _, t in pairs])
    outputs = CleanOutputs.from_prefix(tmp_path / "c", "en", "de")
    report = clean_files(
        src, tgt, outputs, filters=FiltersConfig(duplicates="exact"), src_lang="en", tgt_lang="de", chunk_lines=3
    )
    assert (report.read, report.kept, report.dropped) == (11, 4, {"empty": 0, "exact_duplicate": 7})
    lines = [row.split("\t")[1] for row in outputs.dropped.read_text(encoding="utf-8").splitlines()[1:]]
    assert lines == [str(i) for i in range(5, 12)]
    assert outputs.src.read_text(encoding="utf-8").splitlines() == [s for s, _ in pairs[:4]]


def test_config_rules_and_flags_together(crafted, tmp_path, capsys):
    src, tgt = crafted
    config = tmp_path / "filters.yaml"
    config.write_text("data:\n  filters:\n    identical: true\n    script: true\n", encoding="utf-8")
    argv = ["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "o", "--config", config]
    code, _, err = run_cli([*argv, "--no-script", "--max-nonletter", "0.5"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "o.report.json").read_text(encoding="utf-8"))
    assert report["rules"] == ["empty", "identical", "nonletter"]
    assert report["dropped"] == {"empty": 1, "identical": 1, "nonletter": 1}


def test_outputs_are_replaced_only_on_success(tmp_path, capsys):
    src = write(tmp_path / "x.en", ["a", "b", "c"])
    tgt = write(tmp_path / "x.de", ["a", "b"])
    old = write(tmp_path / "o.en", ["earlier output"])
    code, _, err = run_cli(["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "o"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tmt: error: ")
    assert f"{tgt} ends after line 2 but {src} has 3 lines" in err
    assert old.read_text(encoding="utf-8") == "earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.en", "x.de", "x.en"]  # no temporary file left


def test_files_of_different_lengths_through_a_pipe(tmp_path):
    """A pipe cannot be counted first: the difference is found where the shorter input ends, and nothing is written."""
    src = write(tmp_path / "p.en", ["a", "b", "c", "d"])
    read_fd, write_fd = os.pipe()

    def two_lines() -> None:
        os.write(write_fd, b"A\nB\n")
        os.close(write_fd)

    writer = threading.Thread(target=two_lines)
    writer.start()
    try:
        with pytest.raises(CleaningError) as error:
            clean_files(
                src,
                f"/dev/fd/{read_fd}",
                CleanOutputs.from_prefix(tmp_path / "q", "en", "de"),
                filters=FiltersConfig(),
                src_lang="en",
                tgt_lang="de",
            )
    finally:
        writer.join()
        os.close(read_fd)
    assert f"/dev/fd/{read_fd} ends after line 2 but {src} goes on" in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.en"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--duplicates", "sometimes"], "data.filters.duplicates: 'sometimes' is not one of off, exact, normalized"),
        (["--max-ratio", "0.5"], "data.filters.max_ratio: 0.5 is below 1"),
        (["--max-nonletter", "2"], "data.filters.max_nonletter: 2 is outside [0, 1]"),
        (["--min-words", "5", "--max-words", "3"], "data.filters.max_words: 3 is below data.filters.min_words=5"),
        (["--langid-min-prob", "0.5"], "data.filters.langid_min_prob: applies only with data.filters.langid"),
        (["--src-lang", "english!"], "--src-lang: 'english!' is not a language code"),
        (["--out-src", "{src}"], "the output is the input file"),
        (["--tgt-lang", "en"], "two outputs are this one file"),
    ],
)
def test_bad_options_are_one_line_with_exit_code_2(crafted, tmp_path, capsys, extra, expected):
    src, tgt = crafted
    argv = ["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "bad"]
    code, out, err = run_cli([*argv, *(str(e).format(src=src) for e in extra)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tmt: error: ") and expected in err, err
    assert not list(tmp_path.glob("bad*"))


def test_missing_inputs_and_outputs_are_one_line(crafted, tmp_path, capsys):
    src, tgt = crafted
    code, _, err = run_cli(
        ["clean", src, tmp_path / "none.de", "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "o"], capsys
    )
    assert (code, err) == (2, f"tmt: error: {tmp_path / 'none.de'}: file not found; check the path\n")
    code, _, err = run_cli(["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de"], capsys)
    assert code == 2 and err.count("\n") == 1 and "-o PREFIX" in err


def test_multi30k_en_de_exact_duplicates_counted_independently(multi30k, tmp_path, capsys):
    src, tgt = multi30k / "train.en", multi30k / "train.de"
    argv = ["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "m", "--duplicates", "exact"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    pairs = list(zip(src.read_text(encoding="utf-8").splitlines(), tgt.read_text(encoding="utf-8").splitlines()))
    stripped = [(s.strip(), t.strip()) for s, t in pairs]
    report = json.loads((tmp_path / "m.report.json").read_text(encoding="utf-8"))
    nonempty = [p for p in stripped if all(p)]
    assert report["dropped"] == {
        "empty": len(pairs) - len(nonempty),
        "exact_duplicate": len(nonempty) - len(set(nonempty)),
    }
    assert report["read"] == len(pairs) == 29000


@pytest.mark.slow  # language identification of 58,000 captions: about 15 s
def test_multi30k_en_de_every_rule(multi30k, tmp_path, capsys):
    pytest.importorskip("py3langid", reason='py3langid is not installed (pip install -e ".[langid]")')
    src, tgt = multi30k / "train.en", multi30k / "train.de"
    argv = ["clean", src, tgt, "--src-lang", "en", "--tgt-lang", "de", "-o", tmp_path / "m", *RULE_FLAGS, "--langid"]
    argv[argv.index("--max-words") + 1] = "80"
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "m.report.json").read_text(encoding="utf-8"))
    assert report["read"] == 29000 and report["kept"] + sum(report["dropped"].values()) == 29000
    rows = [row.split("\t") for row in (tmp_path / "m.dropped.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    assert len(rows) == 29000 - report["kept"]
    dropped_lines = {int(row[1]) for row in rows}
    sources = src.read_text(encoding="utf-8").splitlines()
    kept = [s for i, s in enumerate(sources, start=1) if i not in dropped_lines]
    assert (tmp_path / "m.en").read_text(encoding="utf-8").splitlines() == kept
    assert all(sources[int(line) - 1] == source for _, line, source, _ in rows)
    # a clean corpus: well under 1% dropped, and the two captions whose target is "@@" among them
    assert 29000 - report["kept"] < 290
    assert {row[3] for row in rows if row[0] == "length_ratio"} >= {"@@"}
