"""`tmt evaluate`: a checkpoint's translations of a test set, scored with sacreBLEU (``evaluation.evaluate``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import make_checkpoint, run_cli


@pytest.fixture(scope="module")
def ckpt(spm_model, tmp_path_factory) -> Path:
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("ckpt") / "model.pt")


def test_evaluate_reports_scores_and_speed(ckpt, corpus_slice, tmp_path, capsys):
    hyp = tmp_path / "val.hyp"
    code, out, _ = run_cli(
        [
            "evaluate",
            "-c",
            str(ckpt),
            "--src",
            str(corpus_slice["val.en"]),
            "--ref",
            str(corpus_slice["val.de"]),
            "-o",
            str(hyp),
            "--beam",
            "2",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    report = json.loads(out)
    assert set(report) >= {"bleu", "chrf", "sentences_per_s", "tgt_tokens_per_s", "bleu_signature"}
    assert report["sentences_per_s"] > 0 and len(hyp.read_text().splitlines()) == 100
    # the printed BLEU is the BLEU of the written file
    code, out, _ = run_cli(["bleu", "--ref", str(corpus_slice["val.de"]), str(hyp), "--json", "-w", "2"], capsys)
    assert json.loads(out)[0]["score"] == report["bleu"]
