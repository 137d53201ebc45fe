#!/usr/bin/env python
"""Benchmark transformer_mt on this machine; writes <out>/benchmark.json and <out>/benchmark.md.

    python scripts/benchmark.py [--config configs/multi30k_en_de.yaml] [--data DIR] [--out bench]
                                [--threads 2] [--warmup 20] [--updates 60] [--sentences 0]
                                [--checkpoint CKPT] [--reference-checkpoint CKPT] [--ctranslate2] [--quick]
                                [--device cuda [--compile] [--peak-tflops T] [--dry-run]]
                                [--peer fairseq [--fairseq-env DIR] [--peer-updates 40 160] [--only peer]]

What each phase measures and how: the docstring of scripts/benchmarking/__init__.py. This file is the
entry point, also of each phase's own process (``--phase SPEC.json``).
"""

import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # the benchmarking package beside this file, also when loaded by path

from benchmarking import dry_run, gpu_bf16_peak, main, parse_args, phase_ctranslate2

__all__ = ["dry_run", "gpu_bf16_peak", "main", "parse_args", "phase_ctranslate2"]  # what callers load from this file

if __name__ == "__main__":
    main()
