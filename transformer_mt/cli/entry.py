"""The console entry point: runs the app and turns every user mistake into one line on stderr, never a
traceback (exit code 2; 130 when interrupted)."""

from __future__ import annotations

import errno
import sys

import typer

from transformer_mt.cli.app import app
from transformer_mt.environment import set_environment_defaults
from transformer_mt.errors import TmtError

# The base of Click's usage errors, taken from typer's own Click (a copy inside typer from 0.25 on, the
# click package before), whichever this typer has.
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns user errors into one line on stderr (exit code 2)."""
    set_environment_defaults()  # before any command's first oneDNN product (torch-free: --help stays instant)
    try:
        # not standalone: Click's usage errors come here, to be printed as one line rather than a box
        code = app(args=argv, prog_name="tmt", standalone_mode=False)
    except _CLICK_ERROR as exc:  # an unknown option, a missing argument, a value out of range
        if type(exc).__name__ == "NoArgsIsHelpError":  # `tmt` or a group alone: typer printed the help already
            sys.exit(2)
        typer.echo(f"tmt: error: {_usage_error_line(exc)}", err=True)
        sys.exit(2)
    except typer.Abort:  # end of input at a prompt
        typer.echo("tmt: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("tmt: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except (TmtError, UnicodeDecodeError) as exc:
        typer.echo(f"tmt: error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # the machine said no (disk full, a path through a file, ...): name the file and the reason
        typer.echo(f"tmt: error: {_os_error_line(exc)}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(n) gives n; a command's own return value means 0


def _usage_error_line(exc: Exception) -> str:
    """One line for a command-line mistake: what Click found, and where the command's help is."""
    message = " ".join(exc.format_message().split()).rstrip(".")  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "tmt"
    return f"{command}: {message[:1].lower()}{message[1:]} (see '{command} -h')"


def _os_error_line(exc: OSError) -> str:
    """One line for an operating-system error: the file, what the OS said, and the usual fix."""
    if exc.strerror is None:  # raised by tmt itself with a worded message
        return str(exc)
    where = f"{exc.filename}: " if exc.filename is not None else ""
    reason = exc.strerror
    hint = {
        errno.ENOSPC: "free some disk space or write elsewhere",
        errno.EDQUOT: "free some space under your quota",
        errno.EROFS: "write to a writable location",
        errno.ENOTDIR: "a part of the path is a file, not a directory; fix the path",
        errno.EEXIST: "remove it or choose another path",
        errno.ENAMETOOLONG: "use a shorter path",
    }.get(exc.errno or 0, "check the path and permissions")
    return f"{where}{reason}; {hint}"
