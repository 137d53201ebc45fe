"""`tmt serve --engine ctranslate2`: the server takes a translator built outside it (the CTranslate2 engine) and
answers as it answers with tmt's own Translator."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import head
from tests.serve.conftest import serving
from transformer_mt.serve import ServeOptions

httpx = pytest.importorskip("httpx")
pytest.importorskip("ctranslate2")


def test_served_engine_answers_as_the_translator(random_checkpoint, translator, multi30k, tmp_path):
    from transformer_mt.export import ctranslate2_translator

    ckpt = tmp_path / "m.pt"
    shutil.copy(random_checkpoint, ckpt)
    engine = ctranslate2_translator([ckpt], device="cpu", threads=1)
    lines = head(multi30k / "test_2016_flickr.en", 12) + [""]
    options = ServeOptions(max_output_tokens=5)  # the server's cap applies to the engine's outputs too
    # greedy: the tokens of an untrained model are the same in both engines (tests/export/test_engine.py says why)
    want = [nb[0][1] for nb in translator.translate_batch(lines, beam=1, lenpen=0.0, max_output_tokens=5).hypotheses]
    with serving(engine, options) as (url, _):
        answer = httpx.post(f"{url}/translate", json={"text": lines, "beam": 1, "lenpen": 0.0}, timeout=30).json()
        assert answer["translations"] == want and answer["translations"][-1] == ""
        nbest = httpx.post(f"{url}/translate", json={"text": lines[:3], "beam": 3, "nbest": 2}, timeout=30).json()[
            "translations"
        ]
        assert [len(nb) for nb in nbest] == [2, 2, 2] and all(nb[0]["score"] >= nb[1]["score"] for nb in nbest)
        models = httpx.get(f"{url}/models", timeout=30).json()
        assert models["models"][0]["parameters"] == translator.num_parameters
        bad = httpx.post(f"{url}/translate", json={"text": "x", "beam": 100}, timeout=30)
        assert bad.status_code == 422 and "beam" in bad.json()["error"]
