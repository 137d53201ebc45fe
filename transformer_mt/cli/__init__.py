"""The `tmt` command line: thin Typer commands that parse, call one library function, print.

One module per group of commands (``tokenize``, ``train``, ``translate``, ``score``, and the leaf
features' own modules); importing them registers their commands on :data:`app`. User mistakes
are raised by the library as :class:`~transformer_mt.errors.TmtError` and printed here as one line,
never a traceback. Heavy imports (torch, matplotlib, fastapi) happen inside the commands so
`tmt --help` stays instant and a missing optional extra only affects its own command.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from transformer_mt.cli import evaluate, score, tokenize, train, translate  # noqa: F401 - register the commands
from transformer_mt.cli.app import app
from transformer_mt.errors import TmtError

__all__ = ["app", "main"]

# OS errors whose message already names the file and what is wrong with it.
_USER_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError, UnicodeDecodeError)


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point: runs the app and turns user errors into one line on stderr (exit code 2)."""
    try:
        app(args=argv, prog_name="tmt")
    except KeyboardInterrupt:
        typer.echo("tmt: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except (TmtError, *_USER_OS_ERRORS) as exc:
        typer.echo(f"tmt: error: {exc}", err=True)
        sys.exit(2)
