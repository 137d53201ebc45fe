"""``python -m transformer_mt.benchmark``: the benchmark's command line (options: ``--help``)."""

from transformer_mt.benchmark.cli import main

if __name__ == "__main__":
    main(prog="python -m transformer_mt.benchmark")
