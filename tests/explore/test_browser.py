"""`tmt explore` driven in a real browser: headless Chromium (Debian's `chromium`) through Playwright.

One server per module (uvicorn in a thread, the tiny trained checkpoint), one browser page. What the page shows
is checked against what this test computes apart: a Translator loaded here (`tmt translate`'s code), and
`tmt attention`'s maps (``sentence_maps``) for the hover value. Skipped, with the reason, without chromium or
playwright.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("fastapi")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")

from transformer_mt.decoding import Translator  # noqa: E402
from transformer_mt.explore.server import Background, build  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium on PATH: apt-get install -y chromium (Debian) to run the browser tests"
    ),
    pytest.mark.usefixtures("one_thread"),
]
SENTENCE = "A man in a blue shirt is standing on a ladder."
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def page(tiny_checkpoint):
    app, _ = build([str(tiny_checkpoint)], threads=1)
    server = Background(app)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1200, "height": 900})
        tab.set_default_timeout(TIMEOUT_MS)
        tab.goto(server.url)
        tab.wait_for_function("document.getElementById('beam').value !== ''")  # the checkpoint's defaults arrived
        yield tab
        browser.close()
    server.stop()


@pytest.fixture(scope="module")
def translated(page, tiny_checkpoint):
    """Type the sentence, press Enter, wait for the translation; the Translator's output for the same settings."""
    page.fill("#source", SENTENCE)
    page.press("#source", "Enter")
    page.wait_for_function(
        "document.getElementById('translation').textContent.length > 0 && !document.getElementById('go').disabled"
    )
    tr = Translator.from_checkpoint(tiny_checkpoint, device="cpu")
    beam, lenpen = int(page.input_value("#beam")), float(page.input_value("#lenpen"))
    assert (beam, lenpen) == tr.decode_defaults()
    return tr, tr.translate(SENTENCE, beam=beam, lenpen=lenpen)


def test_translation_equals_the_translators(page, translated):
    _, expected = translated
    assert expected and page.text_content("#translation") == expected
    assert page.locator("#error").is_hidden()
    assert page.locator("#tokens .tok").count() >= 2


def test_beam_view_ends_on_the_translation(page, translated):
    _, expected = translated
    assert page.text_content("#beam-final") == expected
    assert page.locator("#beam-open tr").count() > 1 and "stopped" in page.text_content("#beam-reason")


def test_heatmap_is_drawn_and_its_hover_value_is_tmt_attentions(page, translated):
    from transformer_mt.analysis import sentence_maps

    tr, _ = translated
    page.select_option("#att-kind", "cross")
    page.select_option("#att-layer", "1")
    page.select_option("#att-head", "2")
    canvas = page.locator("#heatmap")
    geometry = canvas.evaluate(
        "c => ({x0: +c.dataset.x0, y0: +c.dataset.y0, cell: +c.dataset.cell, "
        "rows: +c.dataset.rows, cols: +c.dataset.cols})"
    )
    colours = canvas.evaluate(
        """(c, g) => { const d = c.getContext('2d').getImageData(g.x0, g.y0, g.cols * g.cell, g.rows * g.cell).data;
                      const seen = new Set();
                      for (let i = 0; i < d.length; i += 4) seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]);
                      return [...seen]; }""",
        geometry,
    )
    assert len(colours) > 2 and colours != ["255,255,255"]  # cells of several shades, not a blank canvas
    maps = sentence_maps(tr, SENTENCE)  # tmt attention's weights, computed here
    weights = maps.cross[1, 2]  # (T, S) of layer 1, head 2
    assert (geometry["rows"], geometry["cols"]) == tuple(weights.shape)
    q, k = divmod(int(weights.argmax()), weights.size(1))
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    scale = box["width"] / canvas.evaluate("c => c.width")
    page.mouse.move(
        box["x"] + (geometry["x0"] + (k + 0.5) * geometry["cell"]) * scale,
        box["y"] + (geometry["y0"] + (q + 0.5) * geometry["cell"]) * scale,
    )
    hover = page.text_content("#hover")
    assert hover.endswith(f": {float(weights[q, k]):.4f}"), hover
    assert maps.tgt_out_pieces[q].replace("\u2581", "_") in hover and maps.src_pieces[k].replace("\u2581", "_") in hover


def test_bad_requests_show_a_readable_message(page, translated):
    for text, words in (("", "text: empty"), ("x" * 1001, "more than --max-chars 1000")):
        page.fill("#source", text)
        page.click("#go")
        page.wait_for_function("!document.getElementById('error').hidden")
        assert words in page.text_content("#error")
    page.evaluate(
        "() => { const s = document.getElementById('checkpoint'); s.add(new Option('gone', 'gone')); "
        "s.value = 'gone'; }"
    )
    page.fill("#source", SENTENCE)
    page.click("#go")
    page.wait_for_function("document.getElementById('error').textContent.includes('is not loaded')")
    assert "'gone' is not loaded" in page.text_content("#error")
    assert page.text_content("#translation")  # the page keeps what it showed: not a blank page
