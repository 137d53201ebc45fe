"""The one registry of `tmt export` and `tmt import` formats (transformer_mt.cli.formats): the commands, their --help
and the error for an unknown format all read it, and a format added to it is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from transformer_mt.checkpoint import Exporter, Importer
from transformer_mt.cli import formats
from transformer_mt.cli.formats import EXPORT_FORMATS, IMPORT_FORMATS, Format, FormatError, exporter, importer


def test_unknown_export_format_names_every_export_format(tmp_path, capsys):
    code, out, err = run_cli(["export", "-c", tmp_path / "x.pt", "-o", tmp_path / "o", "--format", "onnx"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("tmt: error: --format 'onnx' is not supported; choose one of: ")
    assert "ctranslate2" in err and "marian-hf" in err  # both work: the error must offer both
    assert all(f.name in err for f in EXPORT_FORMATS)
    assert not (tmp_path / "o").exists()


def test_unknown_import_format_names_every_import_format(tmp_path, capsys):
    code, out, err = run_cli(["import", tmp_path, "--from", "opennmt", "-o", tmp_path / "m.pt"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("tmt: error: --from 'opennmt' is not supported; choose one of: ")
    assert "marian-hf" in err and all(f.name in err for f in IMPORT_FORMATS)
    assert not (tmp_path / "m.pt").exists()


def test_unknown_format_quotes_a_long_value_briefly():
    with pytest.raises(FormatError) as caught:
        exporter("x" * 10_000)
    assert len(str(caught.value)) < 200 and "choose one of: ctranslate2, marian-hf" in str(caught.value)


@pytest.mark.parametrize(
    ("command", "formats_", "option"), [("export", EXPORT_FORMATS, "--format"), ("import", IMPORT_FORMATS, "--from")]
)
def test_help_lists_every_format(command, formats_, option, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: a label is never wrapped inside the help's box
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0
    line = next(line for line in out.splitlines() if option in line)
    for f in formats_:
        assert f"{f.name} ({f.label})" in line
    assert "marian-hf (" in line


def test_every_registered_converter_is_of_its_direction():
    names = [f.name for f in EXPORT_FORMATS]
    assert len(set(names)) == len(names) and {"ctranslate2", "marian-hf"} <= set(names)
    for f in EXPORT_FORMATS:
        assert isinstance(exporter(f.name), Exporter)
    for f in IMPORT_FORMATS:
        assert isinstance(importer(f.name), Importer)


class EchoExporter(Exporter):
    """A format that copies the checkpoint's bytes: what a new format needs, and nothing more."""

    def convert(self, checkpoint, output, *, quantization=None, force=False) -> Path:
        out = Path(output)
        out.mkdir()
        (out / "copy").write_bytes(Path(checkpoint).read_bytes())
        return out

    def summary(self, output: Path, *, quantization: str | None) -> str:
        return f"echoed into {output} ({quantization})"


class EchoImporter(Importer):
    def convert(self, directory, output, *, force=False) -> Path:
        Path(output).write_bytes((Path(directory) / "copy").read_bytes())
        return Path(output)


def test_a_new_format_is_one_registry_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        formats, "EXPORT_FORMATS", (*EXPORT_FORMATS, Format("echo", "a copy", f"{__name__}:EchoExporter"))
    )
    monkeypatch.setattr(
        formats, "IMPORT_FORMATS", (*IMPORT_FORMATS, Format("echo", "a copy", f"{__name__}:EchoImporter"))
    )
    ckpt = tmp_path / "x.pt"
    ckpt.write_bytes(b"weights")
    code, out, err = run_cli(["export", "-c", ckpt, "-o", tmp_path / "e", "--format", "echo", "-q", "int8"], capsys)
    assert (code, out, err) == (0, f"echoed into {tmp_path / 'e'} (int8)\n", "")
    back = tmp_path / "back.pt"
    code, out, _ = run_cli(["import", tmp_path / "e", "--from", "echo", "-o", back], capsys)
    assert code == 0 and back.read_bytes() == b"weights"
    assert out == f"wrote {back} (from echo {tmp_path / 'e'}); translate with: tmt translate -c {back}\n"
    code, _, err = run_cli(["export", "-c", ckpt, "-o", tmp_path / "o", "--format", "onnx"], capsys)
    assert code == 2 and err.rstrip().endswith("choose one of: ctranslate2, marian-hf, m2m100-hf, echo")


@pytest.mark.slow
def test_help_and_an_unknown_format_import_no_optional_library(tmp_path):
    """`tmt --help` stays instant: no torch, and no extra, until a command converts something."""
    code = (
        "import sys\nfrom transformer_mt.cli import main\nunknown = ['export', '-c', 'x', '-o', "
        f"{str(tmp_path / 'o')!r}, '--format', 'onnx']\nfor argv in (['--help'], ['export', '--help'], ['import', "
        "'--help'], unknown):\n    try:\n        main(argv)\n    except SystemExit:\n        pass\nprint(sorted(m for "
        "m in ('torch', 'ctranslate2', 'transformers', 'safetensors') if m in sys.modules))\n"
    )
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "--format 'onnx' is not supported" in done.stderr
