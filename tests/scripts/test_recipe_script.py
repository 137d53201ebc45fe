"""scripts/multi30k_recipe.sh for any pair: the commands its --dry-run prints, checked against the pair and
the files asked for (the direction of every data path, each test set scored, nothing of en or de left over)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "multi30k_recipe.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def corpus(
    root: Path, src: str, tgt: str, *, tests: tuple[str, ...] = ("test_2016_flickr", "test_2017_mscoco")
) -> Path:
    """A corpus folder with one line per file: train, val and `tests`, in both languages."""
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", *tests):
        for lang in (src, tgt):
            (root / f"{split}.{lang}").write_text(f"{split} {lang}\n", encoding="utf-8")
    return root


def dry_run(*args: str, cwd: Path = REPO) -> tuple[int, list[list[str]], str]:
    """(exit code, the printed commands split as the shell would, stderr)."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    commands = [shlex.split(line) for line in proc.stdout.splitlines() if line and not line.startswith(("==", "--"))]
    return proc.returncode, commands, proc.stderr


def options(cmd: list[str]) -> dict[str, list[str]]:
    """Each option of a command with its values, in order (--set values as a list)."""
    out: dict[str, list[str]] = {}
    for flag, value in zip(cmd, cmd[1:], strict=False):
        if flag.startswith("-") and not value.startswith("-"):
            out.setdefault(flag, []).append(value)
    return out


def test_de_en_on_a_corpus_folder(tmp_path):
    data, run = corpus(tmp_path / "corpus", "de", "en"), tmp_path / "run"
    code, cmds, err = dry_run("--src", "de", "--tgt", "en", "--data", str(data), "--run", str(run))
    assert code == 0, err
    tools = [(Path(c[0]).name, c[1] if len(c) > 1 else "") for c in cmds]
    assert ("prepare_multi30k.sh", "--from") not in tools  # a given corpus is used as it is
    train = next(c for c in cmds if c[1:2] == ["train"])
    sets = dict(s.split("=", 1) for s in options(train)["--set"])
    assert sets == {
        "train.out_dir": str(run),
        "data.train_src": f"{data}/train.de",
        "data.train_tgt": f"{data}/train.en",
        "data.valid_src": f"{data}/val.de",
        "data.valid_tgt": f"{data}/val.en",
    }
    # every data path of the config is replaced: nothing of its own pair is left
    config = yaml.safe_load(Path(REPO / options(train)["--config"][0]).read_text())
    assert {f"data.{k}" for k, v in config["data"].items() if isinstance(v, str) and v} <= set(sets)

    evals = [options(c) for c in cmds if c[1:2] == ["evaluate"]]
    choice = [c for c in cmds if c[1:2] == ["evaluate"] and "--json" in c]
    assert len(evals) == 4 * 3 + 3  # 4 candidates x 3 length penalties on val, then val and the two test sets
    assert len(choice) == 12 and all(options(c)["--src"] == [f"{data}/val.de"] for c in choice)
    for e in evals:
        split = Path(e["--src"][0]).name.rsplit(".", 1)[0]
        assert (
            e["--src"] == [f"{data}/{split}.de"] and e["--ref"] == [f"{data}/{split}.en"] and e["-o"][0].endswith(".en")
        )
    assert [Path(e["--src"][0]).name for e in evals[-3:]] == ["val.de", "test_2016_flickr.de", "test_2017_mscoco.de"]
    assert all(e["--beam"] == ["5"] for e in evals) and {e["--lenpen"][0] for e in evals[:12]} == {"0.6", "1.0", "1.5"}
    bleu = [options(c) for c in cmds if c[1:2] == ["bleu"]]
    assert [b["--ref"] for b in bleu] == [
        [f"{data}/val.en"],
        [f"{data}/test_2016_flickr.en"],
        [f"{data}/test_2017_mscoco.en"],
    ]


def test_multi30k_pair_is_prepared_for_those_languages(tmp_path):
    code, cmds, err = dry_run("--src", "fr", "--tgt", "cs", "--from", str(tmp_path))
    assert code == 0, err
    assert cmds[0] == ["scripts/prepare_multi30k.sh", "--from", str(tmp_path), "--langs", "fr cs"]
    sets = dict(s.split("=", 1) for s in options(next(c for c in cmds if c[1:2] == ["train"]))["--set"])
    assert sets["data.train_src"] == "data/multi30k/train.fr" and sets["data.valid_tgt"] == "data/multi30k/val.cs"
    assert sets["train.out_dir"] == "runs/multi30k_fr_cs"


def test_nothing_of_en_or_de_in_another_pair(tmp_path):
    """With a pair that is neither, no command names an .en or .de file, a run of en-de or an en/de language."""
    data = corpus(tmp_path / "c", "xx", "yy", tests=("test_a",))
    code, cmds, err = dry_run("--src", "xx", "--tgt", "yy", "--data", str(data))
    assert code == 0, err
    words = [
        w for c in cmds for w in c if w != "configs/multi30k_en_de.yaml"
    ]  # the default config's name, not its content
    assert not [w for w in words if re.search(r"\.(en|de)\b|_(en|de)\b|\b(en|de)\b", w)]
    assert any(w == f"{data}/test_a.xx" for w in words) and any(
        w.endswith("runs/c_xx_yy") or w == "train.out_dir=runs/c_xx_yy" for w in words
    )


def test_relative_paths_are_taken_from_the_callers_directory(tmp_path):
    corpus(tmp_path / "mine", "de", "en")
    code, cmds, err = dry_run("--src", "de", "--tgt", "en", "--data", "mine/", cwd=tmp_path)
    assert code == 0, err
    assert f"data.train_src={tmp_path}/mine/train.de" in next(c for c in cmds if c[1:2] == ["train"])


def test_a_test_set_without_its_target_side_is_skipped_with_a_warning(tmp_path):
    data = corpus(tmp_path / "c", "de", "en", tests=("test_ok",))
    (data / "test_orphan.de").write_text("x\n", encoding="utf-8")
    code, cmds, err = dry_run("--src", "de", "--tgt", "en", "--data", str(data))
    assert code == 0 and "test_orphan.de has no" in err and "not scored" in err
    scored = [options(c)["--src"][0] for c in cmds if c[1:2] == ["evaluate"] and "--json" not in c]
    assert scored == [f"{data}/val.de", f"{data}/test_ok.de"]


def test_set_reaches_tmt_train_and_keep_every_adds_the_lawa_candidate(tmp_path):
    data, run = corpus(tmp_path / "corpus", "de", "en"), tmp_path / "run"
    code, cmds, err = dry_run(
        "--data",
        str(data),
        "--src",
        "de",
        "--tgt",
        "en",
        "--run",
        str(run),
        "--set",
        "train.ema_decay=0.999",
        "--set",
        "train.keep_every=1000",
    )
    assert code == 0, err
    train = next(c for c in cmds if c[1:2] == ["train"])
    sets = options(train)["--set"]
    assert "train.ema_decay=0.999" in sets and "train.keep_every=1000" in sets
    assert sets.index("train.keep_every=1000") < sets.index(f"data.train_src={data}/train.de")  # the pair's files win
    average = [options(c) for c in cmds if c[1:2] == ["average"]]
    lawa = [a for a in average if "--every" in a]
    assert (
        len(lawa) == 1
        and lawa[0]["--every"] == ["1000"]
        and lawa[0]["--last"] == ["4"]
        and lawa[0]["--run"] == [str(run)]
    )
    choice = [options(c) for c in cmds if c[1:2] == ["evaluate"] and "--json" in c]
    assert len(choice) == 5 * 3  # last, avg4, avg8, ens4 and lawa4, each at 3 length penalties
    assert sum(o["-c"] == lawa[0]["-o"] for o in choice) == 3
    # without keep_every there is no LAWA candidate
    code, cmds, err = dry_run("--data", str(data), "--src", "de", "--tgt", "en", "--run", str(run))
    assert code == 0 and not any("--every" in c for c in cmds if c[1:2] == ["average"])
    # a misspelt key is one line and exit 2 (found by the config checks, before any decoding)
    code, cmds, err = dry_run(
        "--data", str(data), "--src", "de", "--tgt", "en", "--run", str(run), "--set", "train.keep_evry=1000"
    )
    assert (
        code == 2
        and err.strip()
        == "multi30k_recipe.sh: --set train.keep_evry: unknown key 'train.keep_evry'; did you mean 'keep_every'?"
    )
    assert not any(c[1:2] == ["evaluate"] for c in cmds)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--src", "de", "--tgt", "de"], "--src and --tgt are both 'de'"),
        (["--src"], "--src needs a value"),
        (["--src", "../x"], "give a file suffix"),
        (["--from", "a", "--data", "b"], "give one of them"),
        (["--data", "NOWHERE"], "NOWHERE/train.en not found"),
        (["--config", "NOWHERE.yaml"], "NOWHERE.yaml: file not found"),
        (["--frm", "x"], "unknown argument '--frm'"),
        (["--set", "ema_decay"], "--set 'ema_decay': give SECTION.KEY=VALUE"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, message):
    code, cmds, err = dry_run(*args, cwd=tmp_path)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not cmds
