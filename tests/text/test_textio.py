"""One way to read text (transformer_mt.text.textio) and safe output files, through every reader and command.

Outputs written through a temporary file (an output that is an input refused); a lone "\\r" does not
split a line; stdin without newlines and giant lines read in bounded reads and chunks; bytes decoded
strictly whatever the locale, errors naming FILE:N or <stdin>:N.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sentencepiece as spm

from tests.conftest import make_checkpoint, run_cli
from transformer_mt.config import DataConfig
from transformer_mt.data import load_parallel
from transformer_mt.text import MAX_LINE_BYTES, READ_BYTES, TextError, Tokenizer, textio

VENV_BIN = Path(sys.executable).parent

# Each case: the bytes of a file, and the lines every reader must see in it (written out by hand), or
# the line an invalid-UTF-8 error must name.
DOG, CATS, BIRDS = (
    "Ein Hund läuft durch den Schnee.",
    "Zwei Katzen schlafen auf dem Sofa.",
    "Drei Vögel sitzen auf dem Dach.",
)
CASES: dict[str, tuple[bytes, list[str] | int]] = {
    "bom": (f"\ufeff{DOG}\n{CATS}\n".encode(), [DOG, CATS]),
    "no_final_newline": (f"{DOG}\n{CATS}".encode(), [DOG, CATS]),
    "crlf": (f"{DOG}\r\n{CATS}\r\n".encode(), [DOG, CATS]),
    "lone_cr": (f"{DOG}\r{CATS}\n{BIRDS}\n".encode(), [f"{DOG}\r{CATS}", BIRDS]),
    "invalid_utf8": (f"{DOG}\n".encode() + "Zwei Kätzchen schlafen.\n".encode("latin-1"), 2),  # line 2 saved as latin-1
}


@pytest.fixture(scope="module")
def ckpt(spm_model, tmp_path_factory) -> Path:
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("ckpt") / "model.pt")


def fake_stdin(monkeypatch, data: bytes) -> None:
    """sys.stdin as the interpreter makes it for a pipe: a text wrapper (universal newlines) over the bytes."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def assert_error_names(code: int, err: str, where: str) -> None:
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert f"{where}: invalid UTF-8" in err and "iconv" in err, err


@pytest.mark.parametrize("case", list(CASES))
def test_every_reader_sees_the_same_lines(case, tmp_path, spm_model, ckpt, monkeypatch, capsys):
    data, expected = CASES[case]
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    invalid = isinstance(expected, int)
    where = f"{path}:{expected}"  # what an invalid-UTF-8 error names (checked only when invalid)
    lines: list[str] = [] if isinstance(expected, int) else expected
    tok = Tokenizer(spm_model)

    # tmt tokenize train: the sentences handed to sentencepiece (spied, not trained: a 2-line corpus is too small)
    seen: list[str] = []
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **kw: seen.extend(kw["sentence_iterator"]))
    code, _, err = run_cli(["tokenize", "train", "-i", path, "-o", tmp_path / "spm", "--vocab-size", "50"], capsys)
    monkeypatch.undo()
    if invalid:
        assert_error_names(code, err, where)
    else:
        assert code == 0 and seen == lines, (err, seen)

    # training data: transformer_mt.data.corpus reads the pairs (the target side is clean)
    tgt = tmp_path / "tgt.txt"
    tgt.write_bytes(b"eins\nzwei\n")
    if invalid:
        with pytest.raises(TextError, match=re.escape(where) + ": invalid UTF-8"):
            load_parallel(
                path, tgt, tok, tok, DataConfig(), cache_dir=tmp_path / "cache", filter_long=False, quiet=True
            )
    else:
        corpus = load_parallel(
            path, tgt, tok, tok, DataConfig(), cache_dir=tmp_path / "cache", filter_long=False, quiet=True
        )
        assert corpus.summary.pairs_read == len(lines) and corpus.texts("src") == lines

    # tmt translate: the file chunks, the line count (its progress bar) and one output line per line
    if invalid:
        with pytest.raises(TextError, match=re.escape(where)):
            [line for chunk in textio.file_chunks(path) for line in chunk]
    else:
        assert [line for chunk in textio.file_chunks(path, chunk_lines=1) for line in chunk] == lines
        assert textio.count_lines(path) == len(lines)
    code, out, err = run_cli(["translate", "-c", ckpt, path, "--beam", "1", "--device", "cpu"], capsys)
    if invalid:
        assert_error_names(code, err, where)
    else:
        assert code == 0 and out.count("\n") == len(lines), err

    # tmt bleu, the hypotheses from the file and from stdin, against the expected lines as a clean reference
    ref = tmp_path / "ref.txt"
    ref.write_bytes(b"".join(line.encode() + b"\n" for line in (["x", "y"] if invalid else lines)))
    for hyp, name in ((path, str(path)), ("-", "<stdin>")):
        fake_stdin(monkeypatch, data)
        code, out, err = run_cli(["bleu", "-r", ref, hyp, "-w", "2"], capsys)
        if invalid:
            assert_error_names(code, err, f"{name}:{expected}")
        else:
            assert code == 0 and "= 100.00" in out.splitlines()[0], (out, err)

    # tmt tokenize encode, from the file and from stdin
    for src, name in ((path, str(path)), ("-", "<stdin>")):
        fake_stdin(monkeypatch, data)
        code, out, err = run_cli(["tokenize", "encode", "-m", spm_model, src], capsys)
        if invalid:
            assert_error_names(code, err, f"{name}:{expected}")
        else:
            assert code == 0 and out.splitlines() == [" ".join(pieces) for pieces in tok.encode_pieces(lines)], err


def test_tokenize_train_rejects_invalid_utf8_like_training(tmp_path, corpus_slice, capsys):
    """The real sentencepiece trainer (which turns a reader's exception into a RuntimeError) on a bad line 1500."""
    lines = corpus_slice["train.de"].read_bytes().split(b"\n")
    lines[1499] = "Ein Mädchen".encode("latin-1")
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"\n".join(lines))
    code, _, err = run_cli(
        ["tokenize", "train", "-i", corpus_slice["train.en"], "-i", bad, "-o", tmp_path / "spm", "--vocab-size", "300"],
        capsys,
    )
    assert_error_names(code, err, f"{bad}:1500")
    assert not (tmp_path / "spm.model").exists()


@pytest.mark.parametrize(
    "argv", [["bleu", "-r", "REF"], ["tokenize", "encode", "-m", "MODEL"]], ids=["bleu", "tokenize-encode"]
)
def test_stdin_under_c_locale_is_decoded_strictly(argv, tmp_path, spm_model):
    """Under LC_ALL=C Python reads stdin with surrogateescape: bleu scored garbled text, encode raised a TypeError."""
    ref = tmp_path / "ref.txt"
    ref.write_text("Ein Hund.\nZwei Katzen.\nDrei.\n", encoding="utf-8")
    argv = [{"REF": str(ref), "MODEL": str(spm_model)}.get(a, a) for a in argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8", "PYTHONIOENCODING", "LANG"))}
    proc = subprocess.run(
        [str(VENV_BIN / "tmt"), *argv],
        input=b"Ein Hund.\nZwei K\xe4tzchen.\nDrei.\n",
        capture_output=True,
        env={**env, "LC_ALL": "C"},
        timeout=120,
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert_error_names(proc.returncode, err, "<stdin>:2")
    assert proc.stdout == b""


# --------------------------------------------------------------------------- outputs


def test_output_that_is_an_input_is_refused(tmp_path, spm_model, ckpt, corpus_slice, capsys):
    text = tmp_path / "x.txt"
    original = "Ein Hund läuft.\nZwei Katzen.\n".encode()
    text.write_bytes(original)
    (tmp_path / "hard").mkdir()
    os.link(text, tmp_path / "hard" / "x.txt")  # the same file under another name
    os.symlink(text, tmp_path / "x.link")
    for out in (text, tmp_path / "hard" / "x.txt", tmp_path / "x.link", tmp_path / "." / "x.txt"):
        for argv in (
            ["tokenize", "encode", "-m", spm_model, text, "-o", out],
            ["tokenize", "decode", "-m", spm_model, text, "-o", out],
            ["translate", "-c", ckpt, text, "-o", out, "--device", "cpu"],
        ):
            code, stdout, err = run_cli(argv, capsys)
            assert code == 2 and err.count("\n") == 1 and "the output is the input file" in err, (argv, err)
            assert text.read_bytes() == original
    # tmt evaluate -o pointed at its reference (or its source) is refused before anything is scored
    ref, src = tmp_path / "val.de", tmp_path / "val.en"
    ref.write_bytes(corpus_slice["val.de"].read_bytes())
    src.write_bytes(corpus_slice["val.en"].read_bytes())
    for out in (ref, src):
        before = out.read_bytes()
        code, stdout, err = run_cli(
            ["evaluate", "-c", ckpt, "--src", src, "--ref", ref, "-o", out, "--device", "cpu"], capsys
        )
        assert code == 2 and stdout == "" and "the output is the input file" in err and err.count("\n") == 1, err
        assert out.read_bytes() == before


def test_failed_command_leaves_the_output_untouched(tmp_path, spm_model, ckpt, capsys):
    results = tmp_path / "results.txt"
    results.write_bytes(b"yesterday's results\n")
    os.chmod(results, 0o640)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Ein Hund.\nZwei Katzen.\nDrei K\xe4tzchen.\n")  # fails at line 3, once the output file is open
    for argv in (
        ["tokenize", "encode", "-m", spm_model, tmp_path / "mistyped.txt", "-o", results],
        ["translate", "-c", ckpt, tmp_path / "mistyped.txt", "-o", results, "--device", "cpu"],
        ["tokenize", "encode", "-m", spm_model, bad, "-o", results],
        ["translate", "-c", ckpt, bad, "-o", results, "--device", "cpu", "--beam", "1"],
    ):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert results.read_bytes() == b"yesterday's results\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "results.txt"], (
            "a temporary file was left behind"
        )
    good = tmp_path / "good.txt"
    good.write_text("Ein Hund.\n", encoding="utf-8")
    code, _, err = run_cli(["tokenize", "encode", "-m", spm_model, good, "-o", results], capsys)
    assert (
        code == 0
        and results.read_text(encoding="utf-8") == " ".join(Tokenizer(spm_model).encode_pieces(["Ein Hund."])[0]) + "\n"
    )
    assert (os.stat(results).st_mode & 0o777) == 0o640  # replacing the file kept its permissions


def test_safe_output_writes_through_symlinks_and_devices(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with textio.safe_output(link) as out:
        out.write("new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    with textio.safe_output("/dev/null") as out:  # not replaced by a regular file
        out.write("discarded\n")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(ZeroDivisionError), textio.safe_output(target) as out:
        out.write("half\n")
        raise ZeroDivisionError  # the writer fails half way
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


# --------------------------------------------------------------------------- stdin


def _pipe(data: bytes):
    """A read end of a pipe fed with ``data`` by a thread (which stops quietly if the reader goes away)."""
    r, w = os.pipe()

    def feed():
        try:
            with open(w, "wb") as handle:
                handle.write(data)
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return open(r, "rb", buffering=0), thread


def _counting_reads(monkeypatch, fd: int) -> list[int]:
    sizes: list[int] = []
    real = os.read

    def read(f, n):
        data = real(f, n)
        if f == fd:
            sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "read", read)
    return sizes


def test_stdin_without_newlines_stops_after_a_bounded_read(monkeypatch):
    """4 MiB without a newline: the read stops with an error naming the line once it passes MAX_LINE_BYTES,
    rather than buffering all of it (and re-splitting the buffer on each of 64 reads) into one line."""
    stream, thread = _pipe(b"x" * (4 << 20))
    sizes = _counting_reads(monkeypatch, stream.fileno())
    with pytest.raises(TextError, match=r"^<stdin>:1: line longer than 1,048,576 bytes"):
        next(textio.stdin_chunks(stream))
    assert len(sizes) <= MAX_LINE_BYTES // READ_BYTES + 2 and sum(sizes) <= MAX_LINE_BYTES + READ_BYTES
    stream.close()
    thread.join(timeout=30)


def test_stdin_long_line_and_many_lines_come_in_bounded_chunks(monkeypatch):
    long_line = b"y" * (MAX_LINE_BYTES - 5)  # allowed, arrives in many reads, without a final newline
    short = b"".join(b"line %d\n" % i for i in range(5000))
    stream, thread = _pipe(short + long_line)
    sizes = _counting_reads(monkeypatch, stream.fileno())
    got = list(textio.stdin_chunks(stream, max_lines=1000))
    lines = [line for chunk in got for line in chunk]
    assert lines == [f"line {i}" for i in range(5000)] + [long_line.decode()]
    assert max(len(chunk) for chunk in got) <= 1000  # one read brings up to 5000 lines: still cut into chunks of 1000
    assert len(sizes) <= (len(short) + len(long_line)) // 4096 + 2  # not one read per byte or per line
    thread.join(timeout=30)


def test_line_splitter_rules():
    splitter = textio.LineSplitter("f.txt", max_line_bytes=8)
    got = []
    for piece in (
        b"\xef\xbb",
        b"\xbfab\r",
        b"\ncd\re\n\xef\xbb\xbfz\n",
        b"\r\n",
        b"last\r",
    ):  # BOM and CRLF split across reads
        got += splitter.feed(piece)
    got += splitter.finish()
    assert got == ["ab", "cd\re", "\ufeffz", "", "last\r"]  # a BOM after line 1 is text; "\r" without "\n" is text
    with pytest.raises(TextError, match=r"^f\.txt:2: line longer than 8 bytes"):
        textio.LineSplitter("f.txt", max_line_bytes=8).feed(b"ok\n123456789")


def test_line_splitter_equals_splitting_the_whole_input():
    """Fed in random pieces (one decode per feed, a slow path only for errors), the lines are those of
    splitting the whole input at once by the rules written out here independently."""
    import random

    rng = random.Random(0)
    alphabet = [b"a", b"b ", b"\r", b"\n", b"\n", "ä".encode(), "\u2028".encode(), b"\xef\xbb\xbf"]
    for _ in range(300):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        parts = data.split(b"\n")
        ended = [raw[:-1] if raw.endswith(b"\r") else raw for raw in parts[:-1]]  # lines that "\n" ended
        raws = ended + ([parts[-1]] if parts[-1] else [])
        if raws and raws[0].startswith(b"\xef\xbb\xbf"):
            raws[0] = raws[0][3:]
        expected = [raw.decode("utf-8") for raw in raws]
        splitter, got, i = textio.LineSplitter("x"), [], 0
        while i < len(data):
            step = rng.randrange(1, 9)
            got += splitter.feed(data[i : i + step])
            i += step
        assert got + splitter.finish() == expected, data
        at = rng.randrange(0, len(data) + 1)  # a byte that is never UTF-8: the error names its line
        bad = data[:at] + b"\xff" + data[at:]
        splitter, line = textio.LineSplitter("x"), data.count(b"\n", 0, at) + 1
        with pytest.raises(TextError, match=rf"^x:{line}: invalid UTF-8"):
            for k in range(0, len(bad), 7):
                splitter.feed(bad[k : k + 7])
            splitter.finish()
