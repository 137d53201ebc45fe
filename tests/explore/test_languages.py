"""`tmt explore` and a multilingual checkpoint: each endpoint takes ``tgt_lang`` (the source then starts with its tag),
``/api/checkpoints`` lists the languages, and a wrong or missing language is one line of 422 JSON. Expectations: the
Python API (``Translator.translate(..., tgt_lang=)``) on the same checkpoint, and sentencepiece's own pieces."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import make_checkpoint
from tests.text.multilingual import multilingual_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient

from transformer_mt.decoding import Translator
from transformer_mt.explore.server import build

pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCE = "A man is riding a bike."


@pytest.fixture(scope="module")
def multi(multi30k, tmp_path_factory):
    return multilingual_checkpoint(multi30k, tmp_path_factory.mktemp("explore_multi"))


@pytest.fixture(scope="module")
def client(multi, spm_model, tmp_path_factory):
    plain = make_checkpoint(spm_model, tmp_path_factory.mktemp("explore_plain") / "plain.pt", positions="sinusoidal")
    app, _ = build([f"multi={multi}", f"plain={plain}"], threads=1)
    return TestClient(app)


def test_each_endpoint_translates_into_the_language_asked_for(client, multi):
    described = {c["name"]: c["languages"] for c in client.get("/api/checkpoints").json()["checkpoints"]}
    assert described == {"multi": ["de", "fr"], "plain": []}
    tr = Translator.from_checkpoint(multi, device="cpu")
    words = tr.src_tok.sp.encode(SENTENCE, out_type=str)
    for lang in ("de", "fr"):
        body = {"text": SENTENCE, "beam": 2, "tgt_lang": lang}
        out = client.post("/api/translate", json=body).json()
        assert out["translation"] == tr.translate(SENTENCE, beam=2, tgt_lang=lang)
        assert out["src_pieces"] == [f"<2{lang}>", *words, "</s>"]
        assert client.post("/api/beam", json=body).json()["translation"] == out["translation"]
        att = client.post("/api/attention", json=body).json()
        assert att["src_pieces"] == out["src_pieces"]
        anatomy = client.post("/api/anatomy", json={**body, "batch_with": "A dog."}).json()
        assert anatomy["src_pieces"][0] == out["src_pieces"]
        assert anatomy["src_pieces"][1][0] == f"<2{lang}>"  # the second sentence is asked for the same language


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"checkpoint": "multi"},
            "checkpoint 'multi' is multilingual (target languages de, fr); give the target "
            "language with tgt_lang, e.g. tgt_lang de",
        ),
        ({"checkpoint": "multi", "tgt_lang": "cs"}, "tgt_lang cs: checkpoint 'multi' does not translate into it"),
        ({"checkpoint": "multi", "tgt_lang": "<2fr>"}, "tgt_lang: '<2fr>' is not a language code"),
        ({"checkpoint": "plain", "tgt_lang": "de"}, "tgt_lang de: checkpoint 'plain' states no target language"),
    ],
)
def test_a_wrong_or_missing_language_is_one_line_of_422(client, body, words):
    for path in ("/api/translate", "/api/beam", "/api/attention", "/api/anatomy"):
        r = client.post(path, json={"text": SENTENCE, **body})
        assert r.status_code == 422, (path, r.text)
        assert words in r.json()["error"] and "\n" not in r.json()["error"]
    assert client.post("/api/translate", json={"text": SENTENCE, "checkpoint": "plain"}).status_code == 200


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: apt-get install -y chromium to run the browser tests"
)
def test_the_page_offers_the_languages_of_a_multilingual_checkpoint(client, multi):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    from transformer_mt.explore.server import Background

    server = Background(client.app)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(server.url)
            page.wait_for_function("document.getElementById('beam').value !== ''")
            assert page.locator("#tgt-lang-label").is_visible()
            assert page.eval_on_selector_all("#tgt-lang option", "os => os.map(o => o.value)") == ["de", "fr"]
            page.select_option("#tgt-lang", "fr")
            page.fill("#source", SENTENCE)
            page.press("#source", "Enter")
            page.wait_for_function(
                "document.getElementById('translation').textContent.length > 0 && "
                "!document.getElementById('go').disabled"
            )
            beam = int(page.input_value("#beam"))
            expected = Translator.from_checkpoint(multi, device="cpu").translate(SENTENCE, beam=beam, tgt_lang="fr")
            assert page.text_content("#translation") == expected and page.locator("#error").is_hidden()
            # a checkpoint with no languages: nothing to choose, the select is hidden
            page.select_option("#checkpoint", "plain")
            page.wait_for_function("!document.getElementById('go').disabled")
            assert page.locator("#tgt-lang-label").is_hidden() and page.locator("#error").is_hidden()
            browser.close()
    finally:
        server.stop()
