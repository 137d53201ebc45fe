"""Each phase in a fresh interpreter (``python -m transformer_mt.benchmark --phase SPEC.json``), so the
``ru_maxrss`` it reports is that phase's own peak resident memory (the Python interpreter and torch included).

The parent writes <out>/phases/NAME.spec.json, runs the child and reads NAME.result.json; the child's
output is kept in NAME.log, and a failed phase ends the run with the last lines of it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from transformer_mt import runtime
from transformer_mt.benchmark.ct2 import phase_ctranslate2
from transformer_mt.benchmark.gpu_check import phase_agreement, phase_ct2_gpu
from transformer_mt.benchmark.peer import phase_fairseq
from transformer_mt.benchmark.phases import phase_matmul, phase_syncs, phase_train, phase_translate
from transformer_mt.benchmark.settings import DTYPES

PHASES = {
    "matmul": phase_matmul,
    "train": phase_train,
    "translate": phase_translate,
    "syncs": phase_syncs,
    "ctranslate2": phase_ctranslate2,
    "fairseq": phase_fairseq,
    "agreement": phase_agreement,
    "ct2-gpu": phase_ct2_gpu,
}
ENTRY = "transformer_mt.benchmark"  # each phase runs as `python -m ENTRY --phase SPEC.json`


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def run_phase_file(spec_path: Path) -> None:
    """Child side: run one phase from its spec file and write its result file."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    runtime.set_environment_defaults()  # as tmt sets them: oneDNN's caches bounded before its first product
    torch.set_num_threads(spec["threads"])
    baseline = peak_rss_mib()  # the interpreter with torch and transformer_mt imported
    result = PHASES[spec["kind"]](spec)
    result.update(peak_rss_mib=peak_rss_mib(), rss_after_import_mib=baseline, threads=torch.get_num_threads())
    Path(spec["result"]).write_text(json.dumps(result, indent=1), encoding="utf-8")


def run_phase(spec: dict, out: Path, *, step: str, timeout: float | None = None, tolerant: bool = False) -> dict:
    """Parent side: run ``spec`` in a fresh interpreter and return its result. ``tolerant`` (a GPU check, one shot
    on a lent machine): a phase that fails or outlasts ``timeout`` seconds gives ``{"failed": its last line}`` and
    the run goes on."""
    phases = out / "phases"
    phases.mkdir(parents=True, exist_ok=True)
    spec_path, spec["result"] = phases / f"{spec['name']}.spec.json", str(phases / f"{spec['name']}.result.json")
    spec_path.write_text(json.dumps(spec, indent=1), encoding="utf-8")
    print(f"benchmark: {step} {spec['name']} ...", file=sys.stderr, flush=True)
    # one process, never torchrun's
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS=str(spec["threads"]), MKL_NUM_THREADS=str(spec["threads"]))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", ENTRY, "--phase", str(spec_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        (phases / f"{spec['name']}.log").write_text(text, encoding="utf-8")
        if not tolerant:
            raise
        return {"failed": f"stopped after {timeout:g} s"}
    (phases / f"{spec['name']}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0 and tolerant:
        last = ((proc.stdout + proc.stderr).strip().splitlines() or ["no output"])[-1]
        print(f"benchmark: phase {spec['name']} failed: {last}", file=sys.stderr, flush=True)
        return {"failed": f"exit {proc.returncode}: {last[:200]}"}
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SystemExit(
            f"benchmark: phase {spec['name']} failed (exit {proc.returncode}); its output ends with:\n{tail}"
        )
    return json.loads(Path(spec["result"]).read_text(encoding="utf-8"))


def combine_peaks(start: dict, end: dict) -> dict:
    """The matmul peak of the run: per dtype the faster of the timings at the start and at the end."""
    out = {**start, "peak_rss_mib": max(start["peak_rss_mib"], end["peak_rss_mib"])}
    for name in DTYPES:
        best = max((start[name], end[name]), key=lambda r: r["gflops"])
        out[name] = {**best, "gflops_start": start[name]["gflops"], "gflops_end": end[name]["gflops"]}
    return out


def run_specs(specs: list[dict], out: Path) -> tuple[dict, list[tuple[dict, dict]]]:
    """Run every phase; specs[0] and specs[-1] time the matmul peak at both ends (the faster is kept).
    Returns the combined peak and the (spec, result) pairs of the phases between them."""
    results = [run_phase(spec, out, step=f"[{i}/{len(specs)}]") for i, spec in enumerate(specs, 1)]
    return combine_peaks(results[0], results[-1]), list(zip(specs[1:-1], results[1:-1], strict=True))


def run_each(specs: list[dict], out: Path, *, label: str) -> list[tuple[dict, dict]]:
    """Run phases that have no matmul peak around them (the CTranslate2 rows, after the others)."""
    return [(spec, run_phase(spec, out, step=f"[{label} {i}/{len(specs)}]")) for i, spec in enumerate(specs, 1)]
