"""scripts/serve_bench.py on a tiny random checkpoint and a few Multi30k lines: the table and the JSON have
every row and column, the server's answers equal the in-process Translator's, and the batch sizes come
from /metrics. No test asserts a time or a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "serve_bench.py"

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")


@pytest.mark.slow
def test_serve_bench_reports_every_row(multi30k, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        str(tmp_path / "tiny"),
        "--src",
        str(multi30k / "test_2016_flickr.en"),
    ]
    proc = subprocess.run(
        [*cmd, "--lines", "12", "--clients", "1,4", "--threads", "1", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["lines"] == 12 and [(r["mode"], r["clients"]) for r in rows] == [
        ("in-process, all lines in one call", 0),
        ("in-process, one line per call", 1),
        ("tmt serve, single-line requests", 1),
        ("tmt serve, single-line requests", 4),
    ]
    assert all(r["sentences_per_s"] > 0 for r in rows)
    for r in rows[1:]:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
    for r in rows[2:]:
        assert r["mismatches"] == 0  # the server answers exactly what the Translator gives
        assert (
            1 <= r["batch_requests_mean"] <= r["clients"] and r["batch_lines_mean"] == r["batch_requests_mean"]
        )  # single-line requests
    assert rows[2]["batch_requests_mean"] == 1  # one client: never more than its own request in a call
    table = proc.stdout.strip().splitlines()
    assert table[0].startswith("| mode | clients | sentences/s |") and len(table) == 2 + len(rows)
