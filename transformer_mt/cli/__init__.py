"""The `tmt` command line: thin Typer commands that parse, call one library function, print.

One module per group of commands (``tokenize``, ``train``, ``translate``, ``score``, and the leaf
features' own modules); importing them registers their commands on :data:`app`. User mistakes
are raised by the library as :class:`~transformer_mt.errors.TmtError` and printed as one line by
:func:`~transformer_mt.cli.entry.main`, never a traceback. Heavy imports (torch, matplotlib, fastapi)
happen inside the commands so `tmt --help` stays instant and a missing optional extra only affects its
own command.
"""

from __future__ import annotations

from transformer_mt.cli import (  # noqa: F401 - importing the command modules registers their commands
    clean,
    convert,
    deploy,
    evaluate,
    explore,
    merge,
    score,
    sweep,
    tokenize,
    train,
    translate,
    viz,
)
from transformer_mt.cli.app import app
from transformer_mt.cli.entry import main

__all__ = ["app", "main"]
