"""The public Python API: the README's snippet run as written, against `tmt translate`; `transformer_mt.load`
and `Translator.translate`'s defaults, n-best lists, single strings and refusals."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import transformer_mt
from tests.conftest import REPO, head, make_checkpoint, run_cli
from transformer_mt.decoding import SearchError, TranslationResult, Translator
from transformer_mt.model import Ensemble

pytestmark = pytest.mark.usefixtures("one_thread")


def readme_snippet() -> str:
    """The first ```python block after README.md's `## Python API` heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    heading = re.search(r"^## Python API\s*$", text, flags=re.M)
    if heading is None:
        pytest.skip("README.md has no '## Python API' heading yet")
    block = re.search(r"^```python\n(.*?)^```", text[heading.end() :], flags=re.M | re.S)
    assert block is not None, "README.md: no ```python block after '## Python API'"
    return block.group(1)


def cli_translate(
    checkpoint: Path, lines: list[str], tmp_path: Path, capsys, *, beam: int | None, lenpen: float | None, nbest: int
) -> list[str]:
    """`tmt translate`'s output lines for `lines` with these settings (None: the option left out)."""
    src = tmp_path / "cli_input.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    options = [
        *(["--beam", beam] if beam is not None else []),
        *(["--lenpen", lenpen] if lenpen is not None else []),
        "--nbest",
        nbest,
    ]
    code, out, err = run_cli(["translate", "-c", checkpoint, src, *options], capsys)
    assert code == 0, err
    return out.splitlines()


def test_readme_snippet_prints_what_tmt_translate_prints(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """The snippet runs as written where runs/multi30k_en_de/checkpoint_best.pt is the suite's tiny checkpoint;
    every translate call it makes prints its result, and each result is `tmt translate`'s output for the same
    lines and settings (n-best: the same texts and the scores `tmt translate` prints to 4 decimals)."""
    snippet = readme_snippet()
    run = tmp_path / "readme"
    (run / "runs" / "multi30k_en_de").mkdir(parents=True)
    shutil.copy(tiny_checkpoint, run / "runs" / "multi30k_en_de" / "checkpoint_best.pt")
    calls = []
    real_translate = Translator.translate

    def recorded(self, lines, beam=None, lenpen=None, nbest=1):
        result = real_translate(self, lines, beam, lenpen, nbest)
        calls.append((lines, beam, lenpen, nbest, result))
        return result

    monkeypatch.setattr(Translator, "translate", recorded)
    monkeypatch.chdir(run)
    capsys.readouterr()
    exec(
        compile(snippet, "README.md (Python API)", "exec"), {"__name__": "__readme__"}
    )  # the documented snippet, as written
    printed = capsys.readouterr().out.splitlines()
    monkeypatch.undo()

    assert calls, "the README snippet calls translator.translate"
    assert printed == [str(result) for *_, result in calls]
    for lines, beam, lenpen, nbest, result in calls:
        if isinstance(lines, str):  # one line in, one result out
            lines, result = [lines], [result]
        expected = cli_translate(tiny_checkpoint, lines, tmp_path, capsys, beam=beam, lenpen=lenpen, nbest=nbest)
        if nbest == 1:
            assert result == expected
        else:
            rows = [row.split("\t") for row in expected]
            ours = [(i, score, text) for i, nb in enumerate(result) for score, text in nb]
            assert [(int(i), text) for i, _, text in rows] == [(i, text) for i, _, text in ours]
            assert [score for _, score, _ in rows] == [f"{score:.4f}" for _, score, _ in ours]


@pytest.fixture(scope="module")
def checkpoint(spm_model, tmp_path_factory) -> Path:
    """A random 1+1-layer model with decode.beam 3 and the default lenpen 0.6 (conftest.make_checkpoint)."""
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("api") / "m.pt")


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return transformer_mt.load(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def lines(multi30k) -> list[str]:
    return head(multi30k / "val.en", 5)


def test_beam_and_lenpen_default_to_the_checkpoints_decode_settings(translator, lines, monkeypatch):
    d = translator.cfg.decode
    assert (d.beam, d.lenpen) == (3, 0.6)
    seen = []
    real = Translator.translate_batch

    def spy(self, batch, **settings):
        seen.append(settings)
        return real(self, batch, **settings)

    monkeypatch.setattr(Translator, "translate_batch", spy)
    texts = translator.translate(lines)
    untagged: dict[str, object] = {"sampling": None, "src_prefix": [], "tgt_prefix": []}  # no sampling, no codes
    assert seen[-1] == {"beam": 3, "lenpen": 0.6, "nbest": 1, **untagged}
    assert translator.translate(lines, lenpen=1.0) and seen[-1] == {
        "beam": 3,
        "lenpen": 1.0,
        "nbest": 1,
        **untagged,
    }
    assert translator.translate(lines, beam=1) and seen[-1] == {"beam": 1, "lenpen": 0.6, "nbest": 1, **untagged}
    monkeypatch.undo()
    expected = translator.translate_batch(lines, beam=3, lenpen=0.6)
    assert isinstance(expected, TranslationResult)
    assert texts == [nb[0][1] for nb in expected.hypotheses] and all(isinstance(t, str) for t in texts)


def test_nbest_gives_scored_lists_best_first(translator, lines):
    nbests = translator.translate(lines, beam=4, lenpen=1.0, nbest=3)
    assert nbests == translator.translate_batch(lines, beam=4, lenpen=1.0, nbest=3).hypotheses
    assert len(nbests) == len(lines)
    for nb in nbests:
        assert len(nb) == 3 and all(isinstance(score, float) and isinstance(text, str) for score, text in nb)
        assert [score for score, _ in nb] == sorted((score for score, _ in nb), reverse=True)
    assert [nb[0][1] for nb in nbests] == translator.translate(lines, beam=4, lenpen=1.0)  # the best of each list


def test_a_single_string_gives_a_single_result(translator, lines):
    assert translator.translate(lines[0]) == translator.translate(lines[:1])[0]
    assert isinstance(translator.translate(lines[0]), str)
    assert translator.translate(lines[0], beam=2, nbest=2) == translator.translate(lines[:1], beam=2, nbest=2)[0]
    assert translator.translate("") == "" and translator.translate([]) == []  # an empty line, and no lines
    assert translator.translate(tuple(lines)) == translator.translate(lines)  # any sequence of lines


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beam": 2, "nbest": 3}, r"nbest=3 is out of range; use 1 to the beam size \(2\): 1 <= nbest <= beam"),
        ({"nbest": 4}, r"nbest=4 is out of range; use 1 to the beam size \(3\)"),  # the checkpoint's beam 3
        ({"beam": 0}, r"beam=0 is out of range; use 1 \(greedy\) to 499"),
        (
            {"beam": 600},
            "beam=600 needs a target vocabulary of at least 1202 ids, the model has 1000; use a beam of at most 499",
        ),
        ({"lenpen": math.nan}, "lenpen=nan must be a finite number"),
    ],
)
def test_bad_settings_are_refused_before_any_decoding(translator, lines, monkeypatch, settings, message):
    monkeypatch.setattr(translator.src_tok, "encode", lambda *_: pytest.fail("encoded before refusing the settings"))
    with pytest.raises(SearchError, match=message) as refused:
        translator.translate(lines, **settings)
    assert isinstance(refused.value, transformer_mt.TmtError)


def test_load_takes_one_path_or_a_list_as_an_ensemble(checkpoint, spm_model, tmp_path, lines):
    single = transformer_mt.load(str(checkpoint), device="cpu")
    assert not isinstance(single.model, Ensemble)
    other = make_checkpoint(spm_model, tmp_path / "other.pt", seed=1)
    ensemble = transformer_mt.load([checkpoint, other], device="cpu")
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.model.members) == 2
    assert ensemble.translate(lines) == Translator.from_checkpoints([checkpoint, other], device="cpu").translate(lines)


def test_public_names_without_importing_torch():
    """Every name of __all__ resolves; `import transformer_mt` alone leaves torch unimported (load and
    Translator come on first use), so `tmt --help` stays instant."""
    assert {"load", "Translator", "Config", "load_config", "TmtError", "ConfigError", "__version__"} <= set(
        transformer_mt.__all__
    )
    assert all(getattr(transformer_mt, name) is not None for name in transformer_mt.__all__)
    assert transformer_mt.Translator is Translator
    code = (
        "import sys, transformer_mt; assert 'torch' not in sys.modules, 'torch imported'; "
        "transformer_mt.load; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
