"""The one way tmt reads text, and the one way it writes an output file.

Every reader goes through here: training data (``transformer_mt.data``), ``tmt tokenize train / encode /
decode``, ``tmt translate`` (files and stdin), ``tmt bleu`` and ``tmt evaluate``. The rules:

- Bytes are read and decoded as strict UTF-8, never through the locale's text mode: invalid UTF-8
  stops the read with a :class:`TextError` naming ``FILE:LINE`` (``<stdin>:LINE`` for stdin) and
  the fix, under ``LC_ALL=C`` as under any other locale.
- A line ends at ``b"\\n"`` only, as for ``wc -l``, sacreBLEU and sentencepiece's own reader. The
  ``"\\r"`` of a CRLF ending is removed; a lone ``"\\r"`` is text (universal-newline mode would split
  there and silently give one side of a parallel corpus more lines than the other).
- A last line without ``"\\n"`` is a line; an empty file has none. :func:`count_lines` counts the same.
- A UTF-8 byte-order mark at the very start of a file or stream is removed, once; elsewhere it is text.
- A line holds at most :data:`MAX_LINE_BYTES` bytes (1 MiB, where a sentence has a few hundred).
  A longer one stops the read with a :class:`TextError` naming the line, with at most about that
  much buffered, so a file without newlines or ``head -c 1G /dev/urandom | tmt translate`` fails
  in bounded memory. An error rather than truncation: such a "line" is nearly always a file with
  old Mac ``"\\r"`` endings or no text at all, and one truncated output line would hide that.

Whitespace at the ends of a line is the caller's business (training strips both ends, BLEU the
right one as sacreBLEU does). Bytes are cut into lines as they arrive, each byte examined once, so
stdin without newlines costs linear time, not a re-split of the whole buffer on every read.

Outputs: :func:`safe_output` refuses an output that is one of the inputs (the same file, also
under another name) and writes through a temporary file renamed into place on success, as
``sort -o`` does, so a failed or refused command leaves an existing output's bytes untouched.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import select
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO, cast

from transformer_mt.errors import TmtError

MAX_LINE_BYTES = 1 << 20  # longest line accepted, "\r" included: 1 MiB, thousands of times a real sentence
STDIN = "<stdin>"  # the name errors give standard input
READ_BYTES = 1 << 16  # bytes per read of a stream (a pipe holds 64 KiB)
FILE_READ_BYTES = 1 << 18  # bytes per read of a file: 256 KiB read 580k lines in 0.17 s, 1 MiB in 0.24 s (cache)
_BOM = b"\xef\xbb\xbf"

PathLike = str | os.PathLike


class TextError(TmtError, ValueError):
    """Text that cannot be read as lines: one line naming ``FILE:LINE`` (or the file), the problem and the fix."""


def decode_line(raw: bytes, *, name: str, lineno: int) -> str:
    """One line's bytes (without its ``"\\n"`` / ``"\\r\\n"``) as text: strict UTF-8, and the
    byte-order mark removed when ``lineno`` is 1. ``name`` and ``lineno`` only word the error."""
    start = len(_BOM) if lineno == 1 and raw.startswith(_BOM) else 0
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        fix = (
            "send UTF-8 text, e.g. through iconv -f latin1 -t utf-8"
            if name == STDIN
            else "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
        )
        column = start + exc.start + 1  # 1-based byte position in the line as stored
        raise TextError(
            f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[column - 1]:02x} at column {column}); {fix}"
        ) from None


class LineSplitter:
    """Cuts bytes into decoded lines as they arrive (from a file, a pipe or a terminal).

    :meth:`feed` returns the lines that the new bytes complete; :meth:`finish` the last line when
    it has no ``"\\n"``. Only the new bytes are searched for ``"\\n"``; the unfinished line is kept as
    a list of pieces joined once when it ends, and stops the read once longer than ``max_line_bytes``.
    The complete lines of one feed are decoded in one call (three times faster than line by line);
    only when that fails are they decoded one at a time, to name the bad line.
    """

    def __init__(self, name: str, *, max_line_bytes: int = MAX_LINE_BYTES):
        self.name, self.max_line_bytes = name, max_line_bytes
        self.lineno = 0  # lines returned so far
        self._pending: list[bytes] = []  # pieces of the unfinished line
        self._pending_bytes = 0

    def feed(self, data: bytes) -> list[str]:
        end = data.rfind(b"\n")
        if end < 0:  # no line ends here
            self._keep(data)
            return []
        head = b"".join((*self._pending, data[:end])) if self._pending else data[:end]  # complete lines, "\n"-joined
        self._pending, self._pending_bytes = [], 0
        lines = self._lines(head)
        self._keep(data[end + 1 :])  # the start of the next line (after counting these: an error names the right line)
        return lines

    def _keep(self, piece: bytes) -> None:
        if piece:
            self._pending.append(piece)
            self._pending_bytes += len(piece)
            if self._pending_bytes > self.max_line_bytes:
                raise self._too_long()

    def _lines(self, head: bytes) -> list[str]:
        try:
            lines = head.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            lines = None
        # a str line of n characters has at most 4n bytes: only long ones need encoding to be measured
        if lines is None or (
            len(head) > self.max_line_bytes
            and max((len(line.encode()) for line in lines if 4 * len(line) > self.max_line_bytes), default=0)
            > self.max_line_bytes
        ):
            return [
                self._line(raw, newline=True) for raw in head.split(b"\n")
            ]  # raises at the first bad line, naming it
        if b"\r" in head:  # CRLF endings; a "\r" not followed by "\n" stays text
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        if self.lineno == 0 and lines[0].startswith("\ufeff"):  # the byte-order mark, at the very start only
            lines[0] = lines[0][1:]
        self.lineno += len(lines)
        return lines

    def finish(self) -> list[str]:
        if not self._pending:
            return []
        raw = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return [self._line(raw, newline=False)]

    def _line(self, raw: bytes, *, newline: bool) -> str:
        if len(raw) > self.max_line_bytes:
            raise self._too_long()
        self.lineno += 1
        if newline and raw.endswith(b"\r"):  # CRLF ending; a "\r" not followed by "\n" stays text
            raw = raw[:-1]
        return decode_line(raw, name=self.name, lineno=self.lineno)

    def _too_long(self) -> TextError:
        return TextError(
            f"{self.name}:{self.lineno + 1}: line longer than {self.max_line_bytes:,} bytes; "
            "give one sentence per line "
            "(a file with old Mac \\r line endings: convert them to \\n, e.g. tr '\\r' '\\n')"
        )


# --------------------------------------------------------------------------- reading


def check_input(path: PathLike) -> Path:
    """``path`` as a Path, or a :class:`TextError` when it is missing or cannot be read as a stream of text.

    A regular file, and also a pipe or FIFO (the shell's ``<(zcat corpus.gz)`` is ``/dev/fd/63``) or a
    character device (``/dev/null``, ``/dev/stdin``): those are read once, as they stream, so a caller
    that needs two passes (:func:`count_lines`, then the lines) must check ``Path.is_file`` first.
    Nothing is opened here: opening a FIFO waits for its writer."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:  # missing, a dangling link, or a directory on the way that cannot be searched
        raise TextError(f"{path}: file not found; check the path") from None
    if stat.S_ISDIR(mode):
        raise TextError(f"{path}: is a directory, not a text file")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise TextError(f"{path}: not a text file, pipe or character device; give a file")
    return path


def iter_file(path: PathLike, *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a text file by the module's rules, streamed (memory stays bounded). A missing
    file is an error now, not at the first line."""
    return _file_lines(check_input(path), max_line_bytes)


def _file_lines(path: Path, max_line_bytes: int) -> Iterator[str]:
    splitter = LineSplitter(str(path), max_line_bytes=max_line_bytes)
    with open(path, "rb") as handle:
        while block := handle.read(FILE_READ_BYTES):
            yield from splitter.feed(block)
    yield from splitter.finish()


def read_lines(path: PathLike) -> list[str]:
    """All lines of a text file (see :func:`iter_file`)."""
    return list(iter_file(path))


def iter_stream(
    stream: BinaryIO | TextIO | None = None, *, name: str = STDIN, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[str]:
    """The lines of a stream (default: stdin) by the module's rules. Its bytes are read, not its
    text, so the locale plays no part; a text stream without bytes (io.StringIO) is encoded as UTF-8."""
    read = _byte_reader(sys.stdin if stream is None else stream)
    splitter = LineSplitter(name, max_line_bytes=max_line_bytes)
    while data := read(READ_BYTES):
        yield from splitter.feed(data)
    yield from splitter.finish()


def count_lines(path: PathLike) -> int:
    """Lines in a file as the readers see them: the ``"\\n"`` count, plus 1 for a last line without one.
    On a pipe or FIFO this reads, and so consumes, its lines: count only a regular file (``Path.is_file``)."""
    count, last = 0, b"\n"
    with open(check_input(path), "rb") as handle:
        while block := handle.read(FILE_READ_BYTES):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of at most ``size`` lines."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def file_chunks(path: PathLike, *, chunk_lines: int = 10_000) -> Iterator[list[str]]:
    """A file's lines in lists of at most ``chunk_lines`` (for translating large files in bounded memory)."""
    return chunks(iter_file(path), chunk_lines)


def stdin_chunks(
    stream: BinaryIO | TextIO | None = None, *, max_lines: int = 1000, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[list[str]]:
    """Lines from stdin as they arrive, in lists of at most ``max_lines``: everything already
    readable is batched (a pipe translates in batches), and a lone interactive line is yielded at
    once (no waiting for EOF or for more lines). A stream without a file descriptor is chunked plainly."""
    stream = sys.stdin if stream is None else stream
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.StringIO / BytesIO (io.UnsupportedOperation is an OSError)
        yield from chunks(iter_stream(stream, max_line_bytes=max_line_bytes), max_lines)
        return
    splitter = LineSplitter(STDIN, max_line_bytes=max_line_bytes)
    lines: list[str] = []
    while True:
        ready = not lines or _readable(fd)  # nothing to hand out yet: wait for input
        data = os.read(fd, READ_BYTES) if ready else b""
        if ready and not data:  # EOF
            lines += splitter.finish()
            yield from chunks(lines, max_lines)
            return
        lines += splitter.feed(data)
        while len(lines) >= max_lines:
            yield lines[:max_lines]
            lines = lines[max_lines:]
        if lines and (not ready or not _readable(fd)):  # no more input waiting: translate what is here now
            yield lines
            lines = []


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _byte_reader(stream: BinaryIO | TextIO) -> Callable[[int], bytes]:
    """read(n) -> bytes (b"" at EOF) for a binary stream, a text stream's buffer, or a text-only stream."""
    # A text stream's buffer, else the stream itself: bytes, or text only (a TextIO without a buffer is a TextIOBase).
    binary = cast("BinaryIO | io.TextIOBase", getattr(stream, "buffer", stream))
    if isinstance(binary, io.TextIOBase):  # no bytes underneath (io.StringIO): its text, as UTF-8
        return lambda n: binary.read(n).encode("utf-8", "surrogateescape")
    return getattr(binary, "read1", binary.read)  # read1: what is available now, without waiting for n bytes


# --------------------------------------------------------------------------- writing


@contextlib.contextmanager
def safe_output(path: PathLike | None, *, inputs: Sequence[PathLike | None] = ()) -> Iterator[TextIO]:
    """A UTF-8 text handle for an output file, written as ``sort -o`` writes.

    ``None`` or ``"-"`` is stdout (streamed, nothing to protect). Otherwise: each of ``inputs``
    (``None`` / ``"-"`` skipped) must exist, and the output must not be one of them (compared by
    device and inode, so another name or a hard link of an input is refused too); the text goes
    to a temporary file beside the output, renamed over it when the ``with`` block ends without an
    exception and removed when it raises, so an existing output keeps its bytes until the new ones
    are complete. A symlink is followed (its target is replaced, keeping the link); an existing
    output that is not a regular file (``/dev/null``, a FIFO) is written directly.
    """
    if path is None or str(path) == "-":
        with name_write_errors("<stdout>"):
            yield sys.stdout
        return
    path = Path(path)
    for given in inputs:
        if given is not None and str(given) != "-":
            given = check_input(given)
            if path.exists() and os.path.samefile(path, given):
                raise TextError(
                    f"{path}: the output is the input file {given}; "
                    "writing it would destroy the input, so give another output file"
                )
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():  # a device or FIFO: nothing to replace
        with name_write_errors(str(path)), open(target, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 less the umask, as any new file
    try:
        with name_write_errors(str(path)), open(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # the bytes on disk before the rename makes them the output
        if target.exists():
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))  # replacing a file keeps its permissions
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# Errors only a write gives: a full disk or quota, a file over the size limit.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@contextlib.contextmanager
def name_write_errors(name: str) -> Iterator[None]:
    """A failed write or flush (``OSError`` without a file name: "No space left on device") raised again
    naming the output, so the command line can say which file could not be written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno in _WRITE_ERRNOS:
            raise OSError(exc.errno, exc.strerror, name) from exc
        raise
