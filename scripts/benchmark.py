#!/usr/bin/env python
"""Benchmark transformer_mt on this machine; writes <out>/benchmark.json and <out>/benchmark.md.

    python scripts/benchmark.py [--config configs/multi30k_en_de.yaml] [--data DIR] [--out bench]
                                [--threads 2] [--warmup 20] [--updates 60] [--sentences 0]
                                [--checkpoint CKPT] [--reference-checkpoint CKPT] [--ctranslate2] [--quick]
                                [--device cuda [--compile] [--peak-tflops T] [--dry-run]]
                                [--peer fairseq [--fairseq-env DIR] [--peer-updates 40 160] [--only peer]]

The same command as ``python -m transformer_mt.benchmark``; what each phase measures and how: the docstring of
transformer_mt/benchmark/__init__.py.
"""

from transformer_mt.benchmark import dry_run, gpu_bf16_peak, main, parse_args, phase_ctranslate2

__all__ = ["dry_run", "gpu_bf16_peak", "main", "parse_args", "phase_ctranslate2"]  # what callers load from this file

if __name__ == "__main__":
    main()
