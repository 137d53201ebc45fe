"""The one base class of every user-facing error.

A :class:`TmtError` is a mistake the user can fix: its message is one line that names the file,
the line or the key, what is wrong and what to do. The command line prints it as
``tmt: error: MESSAGE`` (exit code 2) instead of a traceback, and the HTTP server answers it with a
4xx JSON error. Anything else that escapes is a bug in tmt and keeps its traceback.

Each module keeps its own subclass (``ConfigError``, ``DataError``, ...) so callers can catch one
kind; every subclass also derives from the built-in exception it replaced (``ValueError`` or
``RuntimeError``), so existing ``except ValueError`` code keeps working.
"""

from __future__ import annotations


class TmtError(Exception):
    """A user-facing error: one line naming the file/line/key, the problem and the fix."""
