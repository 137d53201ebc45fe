"""`python -m transformer_mt.cli` (what torchrun launches) runs the `tmt` command line."""

from transformer_mt.cli import main

main()
