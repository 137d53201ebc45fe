"""Our BLEU / chrF / TER == sacreBLEU's own command line on real Multi30k files; clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import head, run_cli
from transformer_mt.evaluation import MetricsError, format_json, format_text, read_lines, score, score_files
from transformer_mt.text import TextError

VENV_BIN = Path(sys.executable).parent


def corrupt(lines: list[str], *, drop_every: int = 7, swap_every: int = 3, lower_every: int = 4) -> list[str]:
    """A deterministic "system output": drop every n-th word, swap words, lowercase some first words.

    Every 97th line becomes empty so empty hypotheses are scored as well.
    """
    out, counter = [], 0
    for i, line in enumerate(lines):
        kept = []
        for word in line.split():
            counter += 1
            if counter % drop_every:
                kept.append(word)
        if i % swap_every == 0 and len(kept) > 3:
            kept[1], kept[2] = kept[2], kept[1]
        if i % lower_every == 0 and kept:
            kept[0] = kept[0].lower()  # so that -lc changes the score
        out.append("" if i % 97 == 0 else " ".join(kept))
    return out


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def sacrebleu_cli(*args: str | Path) -> str:
    """sacreBLEU's own command line, run as a separate process."""
    env = {k: v for k, v in os.environ.items() if k != "SACREBLEU_FORMAT"}
    proc = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *map(str, args)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.rstrip("\n")


def assert_matches_cli(ours: dict, refs: list[Path], hyp: Path, cli_flags: list[str]) -> None:
    metrics = list(ours)
    # two decimals and the signatures, from the CLI's JSON
    out = sacrebleu_cli(*refs, "-i", hyp, "-m", *metrics, *cli_flags, "--format", "json", "-w", "2")
    cli = json.loads(out)
    cli = cli if isinstance(cli, list) else [cli]
    assert [c["name"] for c in cli] == [r["name"] for r in ours.values()]
    for c, r in zip(cli, ours.values()):
        assert float(f"{r['score']:.2f}") == c["score"], r["name"]
        assert r["signature"] == c["signature"]
    # the machine-readable output, character for character
    assert format_json(ours, width=2) == out
    # and the human-readable output, character for character
    assert format_text(ours) == sacrebleu_cli(*refs, "-i", hyp, "-m", *metrics, *cli_flags, "--format", "text")


@pytest.fixture(scope="module")
def val(multi30k, tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    ref_lines = read_lines(multi30k / "val.de")
    ref = write(root / "ref.de", ref_lines)
    hyp = write(root / "hyp.de", corrupt(ref_lines))
    return ref, hyp


def test_bleu_chrf_match_sacrebleu_cli(val):
    ref, hyp = val
    ours = score_files(hyp, [ref])
    assert list(ours) == ["bleu", "chrf"]
    assert ours["bleu"]["signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{_version()}"
    assert 10 < ours["bleu"]["score"] < 90  # a partial match, so the comparison means something
    assert_matches_cli(ours, [ref], hyp, [])
    # the score-only numbers of `-b`
    assert sacrebleu_cli(ref, "-i", hyp, "-m", "bleu", "chrf", "-b", "--format", "text") == format_text(
        ours, score_only=True
    )


def test_lowercase_matches_sacrebleu_cli(multi30k, tmp_path):
    ref_lines = read_lines(multi30k / "test_2016_flickr.de")
    ref = write(tmp_path / "ref.de", ref_lines)
    hyp = write(tmp_path / "hyp.de", corrupt(ref_lines, drop_every=5, lower_every=2))
    mixed = score_files(hyp, [ref])
    ours = score_files(hyp, [ref], lowercase=True)
    assert "case:lc" in ours["bleu"]["signature"] and "case:lc" in ours["chrf"]["signature"]
    assert ours["bleu"]["score"] > mixed["bleu"]["score"]
    assert_matches_cli(ours, [ref], hyp, ["-lc", "--chrf-lowercase"])


def test_two_references_and_ter_match_sacrebleu_cli(val, tmp_path):
    # TER is the slow metric (shift search per sentence): 400 validation sentences suffice here
    ref = write(tmp_path / "ref.de", read_lines(val[0])[:400])
    hyp = write(tmp_path / "hyp.de", read_lines(val[1])[:400])
    # a second, different reference of the same sentences
    ref2 = write(tmp_path / "ref2.de", corrupt(read_lines(ref), drop_every=11, swap_every=2, lower_every=1000))
    ours = score_files(hyp, [ref, ref2], metrics=("bleu", "chrf"), ter=True)
    one = score_files(hyp, [ref], metrics=("bleu",))
    assert ours["bleu"]["signature"].startswith("nrefs:2|") and ours["bleu"]["score"] > one["bleu"]["score"]
    assert_matches_cli(ours, [ref, ref2], hyp, [])


def test_in_memory_lists_give_the_same_scores(val):
    ref, hyp = val
    files = score_files(hyp, [ref])
    lists = score(read_lines(hyp), [read_lines(ref)])
    assert files == lists


def test_mismatched_counts_name_both(val, tmp_path):
    ref, hyp = val
    short = write(tmp_path / "short.de", read_lines(hyp)[:1000])
    with pytest.raises(MetricsError) as err:
        score_files(short, [ref])
    assert str(err.value) == (
        f"{short} has 1000 lines but {ref} has 1014; line i of the hypotheses must translate line i of each reference "
        "(empty lines included)"
    )
    with pytest.raises(MetricsError, match=r"^the hypotheses have 2 lines but reference 2 has 1; "):
        score(["a", "b"], [["a", "b"], ["a"]])


def test_argument_mistakes_are_explained():
    with pytest.raises(MetricsError, match=r"unknown metric 'meteor'; choose from bleu, chrf, ter"):
        score(["a"], [["a"]], metrics=("bleu", "meteor"))
    with pytest.raises(MetricsError, match=r"wrap a single reference as \[ref_lines\]"):
        score(["a"], ["a"])
    with pytest.raises(MetricsError, match=r"BLEU tokenizer 'moses' is unknown; choose from none, zh, 13a"):
        score(["a"], [["a"]], tokenize="moses")
    with pytest.raises(MetricsError, match="no lines to score"):
        score([], [[]])


def test_read_lines_keeps_empty_lines_and_reports_bad_files(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("eins \r\n\nzwei\u2028drei\nvier".encode("utf-8"))
    assert read_lines(path) == ["eins", "", "zwei\u2028drei", "vier"]  # split on "\n" only, as sacreBLEU's CLI
    path.write_bytes(b"")
    assert read_lines(path) == []

    with pytest.raises(MetricsError) as err:
        read_lines(tmp_path / "missing.txt")
    assert str(err.value) == f"{tmp_path / 'missing.txt'}: file not found; check the path"

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("gut\nschön\n".encode("latin-1"))
    # the one text reader's error (transformer_mt.text.textio), as every reader gives
    with pytest.raises(TextError) as bad_text:
        read_lines(latin1)
    assert str(bad_text.value) == (
        f"{latin1}:2: invalid UTF-8 (byte 0xf6 at column 4); convert the file to UTF-8, "
        "e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
    )


def _version() -> str:
    import sacrebleu

    return sacrebleu.__version__


def _sacrebleu(*args: str) -> str:
    return subprocess.run([str(VENV_BIN / "sacrebleu"), *args], capture_output=True, text=True, check=True).stdout


def test_bleu_matches_sacrebleu_command_line(multi30k, tmp_path, capsys):
    ref = multi30k / "test_2016_flickr.de"
    # a deterministic imperfect hypothesis: every 5th word dropped, every 9th line reversed
    hyp_lines = []
    for i, line in enumerate(head(ref, 1000)):
        words = [w for k, w in enumerate(line.split()) if k % 5 != 4]
        hyp_lines.append(" ".join(reversed(words) if i % 9 == 0 else words))
    hyp = tmp_path / "hyp.de"
    hyp.write_text("\n".join(hyp_lines) + "\n", encoding="utf-8")
    for extra in ([], ["-lc"]):
        code, out, _ = run_cli(["bleu", "--ref", str(ref), str(hyp), "--json", "-w", "2", *extra], capsys)
        ours = json.loads(out)
        theirs = json.loads(
            _sacrebleu(
                str(ref),
                "-i",
                str(hyp),
                "-m",
                "bleu",
                "chrf",
                "-w",
                "2",
                "--format",
                "json",
                *(["-lc", "--chrf-lowercase"] if extra else []),
            )
        )
        assert [(o["name"], o["score"], o["signature"]) for o in ours] == [
            (t["name"], t["score"], t["signature"]) for t in theirs
        ]
    code, out, _ = run_cli(["bleu", "--ref", str(ref), str(hyp)], capsys)
    assert out.strip() == _sacrebleu(str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "--format", "text").strip()
    short = tmp_path / "short.de"
    short.write_text("\n".join(hyp_lines[:10]) + "\n")
    code, _, err = run_cli(["bleu", "--ref", str(ref), str(short)], capsys)
    assert code == 2 and "10" in err and "1000" in err and err.count("\n") == 1
