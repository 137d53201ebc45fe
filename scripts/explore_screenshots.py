"""Screenshots of the `tmt explore` page on one sentence, and how long it took to show.

Serves the page for the checkpoint(s) in this process, opens it in headless Chromium (Debian's `chromium`,
driven by Playwright), types the sentence, waits until the translation, beam search, attention, masks and
positions are drawn, and writes one PNG per section plus the whole page:

    .venv/bin/python scripts/explore_screenshots.py -c runs/multi30k_en_de/checkpoint_best.pt \\
        --sentence "A man in a blue shirt is standing on a ladder." -o docs/img

It prints two times: the page's load (navigation until the page asked the API for the checkpoints and filled
its settings) and the translation (Enter until every section is drawn, the model's work included). They mean
something only on a quiet machine: take them with nothing else running.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

SECTIONS = {  # PNG name: the page's section
    "explore_translation.png": "#translation-view",
    "explore_beam.png": "#beam-view",
    "explore_attention.png": "#attention-view",
    "explore_anatomy.png": "#anatomy-view",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-c", "--checkpoint", action="append", required=True, help="PATH or NAME=PATH; repeat for a second checkpoint"
    )
    parser.add_argument("--sentence", default="A man in a blue shirt is standing on a ladder.")
    parser.add_argument(
        "--reference", default=None, help="teacher-force this target (the loss view) instead of the translation"
    )
    parser.add_argument(
        "--batch-with",
        default="Two dogs play.",
        help="a second sentence in the masks' batch, so one is padded ('' for none)",
    )
    parser.add_argument("--head", default="mean", help="attention head drawn large: a number or 'mean'")
    parser.add_argument("--layer", type=int, default=0, help="the layer whose attention is drawn (0 = the lowest)")
    parser.add_argument("-o", "--output", type=Path, default=Path("docs/img"))
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = parser.parse_args(argv)

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print(
            "explore_screenshots: no chromium on PATH; install it (Debian: apt-get install -y chromium)",
            file=sys.stderr,
        )
        return 2
    import torch
    from playwright.sync_api import sync_playwright

    from transformer_mt import runtime
    from transformer_mt.explore.server import Background, build

    workers = args.threads or torch.get_num_threads()
    runtime.set_threads(1)  # as `tmt explore` does: the requests' thread decodes with `workers`, this one keeps one
    app, _ = build(args.checkpoint, threads=workers)
    server = Background(app)
    args.output.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 900}, device_scale_factor=1)
            page.set_default_timeout(120_000)
            tic = time.perf_counter()
            page.goto(server.url)
            page.wait_for_function("document.getElementById('beam').value !== ''")
            load_s = time.perf_counter() - tic
            page.fill("#source", args.sentence)
            if args.reference:
                page.fill("#reference", args.reference)
            page.fill("#batch-with", args.batch_with)
            tic = time.perf_counter()
            page.press("#source", "Enter")
            page.wait_for_function(
                "document.getElementById('status').textContent.startsWith('done') "
                "|| !document.getElementById('error').hidden"
            )
            translate_s = time.perf_counter() - tic
            if not page.locator("#error").is_hidden():
                print(f"explore_screenshots: the page says: {page.text_content('#error')}", file=sys.stderr)
                return 1
            page.select_option("#att-layer", str(args.layer))
            page.select_option("#att-head", args.head)
            for name, selector in SECTIONS.items():
                page.locator(selector).screenshot(path=str(args.output / name))
                print(args.output / name)
            page.screenshot(path=str(args.output / "explore_page.png"), full_page=True)
            print(args.output / "explore_page.png")
            browser.close()
    finally:
        server.stop()
    print(
        f"translation: {page_text(args.sentence)} -> page load {load_s:.2f} s, "
        f"translation with every view {translate_s:.2f} s"
    )
    return 0


def page_text(sentence: str) -> str:
    return sentence if len(sentence) <= 60 else sentence[:57] + "..."


if __name__ == "__main__":
    sys.exit(main())
