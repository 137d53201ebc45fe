"""`tmt serve` and a multilingual model: the request's ``tgt_lang``, requests of several languages batched together,
``/models`` naming each model's languages, and a bad language refused as one line of 4xx JSON while the server keeps
serving. Expectations come from the Python API (``Translator.translate(..., tgt_lang=)``) on the same checkpoint."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import head
from tests.serve.conftest import serving
from tests.text.multilingual import multilingual_checkpoint
from transformer_mt.serve import ServeOptions

httpx = pytest.importorskip("httpx")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def multi(multi30k, tmp_path_factory):
    from transformer_mt.decoding import Translator

    return Translator.from_checkpoint(multilingual_checkpoint(multi30k, tmp_path_factory.mktemp("multi")), device="cpu")


def test_tgt_lang_picks_the_language_and_concurrent_requests_each_get_theirs(multi, multi30k):
    lines = [*head(multi30k / "val.en", 5), ""]
    want = {lang: multi.translate(lines, beam=2, tgt_lang=lang) for lang in ("de", "fr")}
    scored = multi.translate(lines[0], beam=2, nbest=2, tgt_lang="fr")
    options = ServeOptions(batch_wait_ms=200)  # the two languages' requests may share a batch
    with serving(multi, options) as (url, served):
        models = httpx.get(f"{url}/models").json()["models"]
        assert [m["languages"] for m in models] == [["de", "fr"]]
        got: dict[str, list[str]] = {}

        def ask(lang: str) -> None:
            r = httpx.post(f"{url}/translate", json={"text": lines, "tgt_lang": lang, "beam": 2}, timeout=60)
            assert r.status_code == 200, r.text
            got[lang] = r.json()["translations"]

        threads = [threading.Thread(target=ask, args=(lang,)) for lang in want]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        assert served.batcher.lines == 2 * len(lines)
        r = httpx.post(f"{url}/translate", json={"text": lines[0], "tgt_lang": "fr", "beam": 2, "nbest": 2}).json()
        assert [(t["text"], t["score"]) for t in r["translations"][0]] == [(t, round(s, 4)) for s, t in scored]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"text": "A man."},
            "model 'm' is multilingual (target languages de, fr); give the target language with "
            "tgt_lang, e.g. tgt_lang de (GET /models lists each model's languages)",
        ),
        (
            {"text": "A man.", "tgt_lang": "cs"},
            "tgt_lang cs: model 'm' does not translate into it; its target languages are de, fr",
        ),
        (
            {"text": "A man.", "tgt_lang": "x" * 100_000},
            "tgt_lang: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' is not a language code",
        ),
        ({"text": "A man.", "tgt_lang": 7}, "tgt_lang: Input should be a valid string (got 7)"),
        (
            {"text": "A man.", "tgt_lang": "fr", "lang": "fr"},
            "lang: unknown field; the fields are text, model, beam, lenpen, nbest, tgt_lang, src_lang",
        ),
    ],
)
def test_a_bad_language_is_one_line_of_422_json_and_the_server_keeps_serving(multi, body, words):
    with serving(multi, ServeOptions(batch_wait_ms=0)) as (url, served):
        r = httpx.post(f"{url}/translate", json=body, timeout=60)
        assert r.status_code == 422
        error = r.json()["error"]
        assert words in error and "\n" not in error and len(error) < 300, error
        assert "/" not in error.split("(GET /models")[0]  # the checkpoint's path is never shown
        ok = httpx.post(f"{url}/translate", json={"text": "A man.", "tgt_lang": "de", "beam": 1}, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["translations"]) == 1
        assert served.batcher.requests == 1  # the refused request was never queued


def test_a_model_without_languages_lists_none_and_refuses_one(translator):
    with serving(translator, ServeOptions(batch_wait_ms=0)) as (url, _):
        assert httpx.get(f"{url}/models").json()["models"][0]["languages"] == []
        r = httpx.post(f"{url}/translate", json={"text": "A man.", "tgt_lang": "de"})
        assert r.status_code == 422 and r.json()["error"].startswith("tgt_lang de: model 'm' states no target language")
        assert httpx.post(f"{url}/translate", json={"text": "A man.", "beam": 1}, timeout=60).status_code == 200
