"""scripts/hf_compare.py on a tiny MarianMT model transformers built: a full report, and agreement on every line."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import REPO

pytest.importorskip("transformers")


@pytest.mark.slow
def test_report_on_a_tiny_marian_model(multi30k, tmp_path, one_thread):
    from tests.hf.conftest import build_marian_dir

    marian = build_marian_dir(tmp_path / "m", multi30k, shared=True, activation="swish")
    spec = importlib.util.spec_from_file_location("hf_compare", REPO / "scripts" / "hf_compare.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = [
        str(marian.path),
        "--src",
        str(multi30k / "val.en"),
        "--ref",
        str(multi30k / "val.de"),
        "-n",
        "12",
        "--max-len",
        "16",
    ]
    report = script.main([*argv, "--json", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == report
    assert report["lines"] == 12 and report["greedy_identical"] == 12 and report["beam4_identical"] == 12
    assert 0 <= report["max_abs_logprob_diff"] < 1e-4
    assert report["tmt_sentences_per_s"] > 0 and report["transformers_sentences_per_s"] > 0
