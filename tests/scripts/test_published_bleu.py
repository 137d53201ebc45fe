"""scripts/published_bleu.py: without sacremoses it stops with one line naming the fix; with it, text that
differs from the reference only in case and spacing around punctuation scores 100 (the Moses steps
applied to both sides), and the line-count check of tmt bleu applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "published_bleu.py"


def run_script(*args: str, block_sacremoses: bool = False) -> subprocess.CompletedProcess:
    # sys.modules[name] = None makes "import name" raise ImportError: the machine without the package
    block = "sys.modules['sacremoses'] = None; " if block_sacremoses else ""
    argv = [str(SCRIPT), *args]
    code = f"import runpy, sys; {block}sys.argv = {argv!r}; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_missing_sacremoses_is_one_line_with_the_fix(tmp_path):
    (tmp_path / "ref.de").write_text("Ein Hund.\n", encoding="utf-8")
    result = run_script("--ref", str(tmp_path / "ref.de"), str(tmp_path / "ref.de"), block_sacremoses=True)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "published_bleu.py: needs the sacremoses package (the Moses tokenizer in Python); run: pip install sacremoses"
    )


def test_case_and_punctuation_spacing_do_not_count(tmp_path):
    pytest.importorskip("sacremoses")
    ref, hyp, short = tmp_path / "ref.de", tmp_path / "hyp.de", tmp_path / "short.de"
    ref.write_text("Zwei Männer, die auf einer Bank sitzen.\nEin Hund läuft durch den Schnee!\n", encoding="utf-8")
    hyp.write_text("zwei MÄNNER , die auf einer bank sitzen .\nein hund läuft durch den schnee !\n", encoding="utf-8")
    short.write_text("zwei männer\n", encoding="utf-8")
    result = run_script("--ref", str(ref), str(hyp))
    assert result.returncode == 0, result.stderr
    assert "BLEU 100.00" in result.stdout
    assert "16 reference tokens" in result.stderr  # 9 + 7 words and punctuation marks
    result = run_script("--ref", str(ref), str(short))
    assert result.returncode == 1 and "has 1 lines but" in result.stderr and "Traceback" not in result.stderr
