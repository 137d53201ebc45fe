"""End-to-end tests: the `tmt` command line, the public Python API, and what no input may break."""
