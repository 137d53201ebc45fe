"""tmt inspect / plot / attention and the PE picture: counts, shapes and weights against independent computations."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import transformer_mt.cli.viz  # noqa: F401 - registers the commands (also done by transformer_mt.cli)
from transformer_mt.cli import main
from transformer_mt.config import load_config
from transformer_mt.model import Transformer

REPO = Path(__file__).resolve().parents[1]
TINY_YAML = """\
data: {max_len: 60}
tokenizer: {vocab_size: 60}
model: {encoder_layers: 2, decoder_layers: 1, d_model: 24, heads: 3, d_ff: 40, norm: %s, positions: %s,
        share_all_embeddings: %s, share_decoder_embeddings: %s, max_positions: 64}
"""


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def decoded_png(path: Path):
    """The PNG as an (H, W, channels) array, read back by matplotlib's own PNG decoder."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return imread(path)


def assert_not_blank(image) -> None:
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.05  # more than a blank or single-colour canvas


# ---------------------------------------------------------------- tmt inspect
def layer_params(d: int, f: int, *, cross: bool) -> int:
    """One layer from first principles: (Q, K, V, O projections with biases) per attention, FFN, LayerNorms."""
    attention = 4 * (d * d + d)
    return attention * (2 if cross else 1) + (d * f + f) + (f * d + d) + (3 if cross else 2) * 2 * d


@pytest.mark.parametrize("norm,positions,share_all,share_dec", [("post", "sinusoidal", "true", "true"), ("pre", "learned", "false", "false")])
def test_inspect_totals_equal_parameter_count(tmp_path, capsys, norm, positions, share_all, share_dec):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML % (norm, positions, share_all, share_dec))
    code, out, err = run_cli(capsys, "inspect", str(path), "--src-len", "7", "--tgt-len", "5")
    assert code == 0, err
    cfg = load_config(path, check_files=False)
    model = Transformer(cfg.model, src_vocab_size=60, tgt_vocab_size=60)
    expected = sum(p.numel() for p in model.parameters())
    d, v = 24, 60
    by_hand = 2 * layer_params(d, 40, cross=False) + layer_params(d, 40, cross=True)
    by_hand += v * d if share_all == "true" else 3 * v * d  # source, target embeddings and output layer
    by_hand += 64 * d if positions == "learned" else 0
    by_hand += 2 * 2 * d if norm == "pre" else 0  # final LayerNorm of each stack
    assert expected == by_hand
    assert f"parameters: {expected:,} " in out
    rows = {m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"^(\S+)\s+.*?\s([\d,]+)(?:\s{3}|$)", out, re.M)}
    assert rows["Transformer"] == expected
    top = [line for line in out.splitlines() if re.match(r"^  \S", line)]  # the model's direct children
    assert sum(int(re.search(r"\s([\d,]+)(\s{3}|$)", line).group(1).replace(",", "")) for line in top) == expected
    # shapes from first principles: B=2, S=7, T=5, H=3, Dk=Dv=8
    assert "Q (B, H, S, Dk) = (2, 3, 7, 8)" in out and "scores softmax(QK^T/sqrt(Dk)) (B, H, S, S) = (2, 3, 7, 7)" in out
    assert "scores softmax(QK^T/sqrt(Dk)) (B, H, T, S) = (2, 3, 5, 7)" in out  # cross-attention
    assert "mask allowed (2, 1, 5, 5) bool, True = attend (causal + padding)" in out
    assert "(2, 5, 24) -> (2, 5, 60)" in out  # the output layer's logits


@pytest.mark.parametrize("name,size,params", [("transformer_base.yaml", "base", 65), ("transformer_big.yaml", "big", 213)])
def test_inspect_names_the_paper_size(capsys, name, size, params):
    code, out, err = run_cli(capsys, "inspect", str(REPO / "configs" / name))
    assert code == 0, err
    assert f"paper, Table 3 '{size}': {params}M parameters" in out
    d, f = (512, 2048) if size == "base" else (1024, 4096)
    ours = 37000 * d + 6 * layer_params(d, f, cross=False) + 6 * layer_params(d, f, cross=True)
    assert f"parameters: {ours:,} " in out
    code, out, _ = run_cli(capsys, "inspect", str(REPO / "configs" / name), "--set", "model.d_ff=1000")
    assert code == 0 and "paper, Table 3" not in out


def test_inspect_checkpoint_counts_its_loaded_model(capsys, tiny_checkpoint):
    from transformer_mt.translate import Translator

    code, out, err = run_cli(capsys, "inspect", str(tiny_checkpoint))
    assert code == 0, err
    model = Translator.from_checkpoint(tiny_checkpoint, device="cpu").model
    assert f"parameters: {sum(p.numel() for p in model.parameters()):,} " in out
    assert "Q (B, H, T, Dk) = (2, 4, 8, 8)" in out and "meta device" not in out


def test_pe_picture_of_config_and_refusal_for_learned(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML % ("pre", "sinusoidal", "true", "true"))
    code, _, err = run_cli(capsys, "inspect", str(path), "--pe", str(tmp_path / "pe.png"), "--pe-length", "50")
    assert code == 0, err
    assert_not_blank(decoded_png(tmp_path / "pe.png"))
    path.write_text(TINY_YAML % ("pre", "learned", "true", "true"))
    code, _, err = run_cli(capsys, "inspect", str(path), "--pe", str(tmp_path / "learned.png"))
    assert code == 2 and "learned" in err and err.count("\n") == 1 and not (tmp_path / "learned.png").exists()


# ---------------------------------------------------------------- tmt plot
def test_plot_real_run_writes_a_png(tmp_path, capsys, tiny_run):
    out = tmp_path / "curves.png"
    code, _, err = run_cli(capsys, "plot", str(tiny_run.run_dir), "-o", str(out))
    assert code == 0, err
    assert_not_blank(decoded_png(out))


def test_plot_reads_records_with_and_without_kind(tmp_path, capsys):
    from transformer_mt.viz.curves import read_run

    new, old = tmp_path / "a" / "run", tmp_path / "b" / "run"  # same directory name: the legend tells them apart
    for d in (new, old):
        d.mkdir(parents=True)
    (new / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "train", "update": 10, "wall": 5.0, "loss": 7.0}, {"kind": "valid", "update": 10, "wall": 6.0, "val_loss": 6.5, "val_bleu": 1.0},
        {"kind": "train", "update": 20, "wall": 9.0, "loss": 6.0}, {"kind": "summary", "update": 20, "wall": 9.5, "target_tokens": 100},
    ]) + "\n")
    (old / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"update": 10, "wall": 4.0, "loss": 7.5}, {"update": 10, "wall": 4.5, "val_loss": 7.0}, {"update": 20, "wall": 8.0, "loss": 6.5},
    ]) + "\n" + '{"update": 30, "wa')  # a record being written when the file was read
    a, b = read_run(new), read_run(old)
    assert [r["update"] for r in a.train] == [10, 20] and [r["val_bleu"] for r in a.valid] == [1.0]
    assert [r["loss"] for r in b.train] == [7.5, 6.5] and [r["val_loss"] for r in b.valid] == [7.0]
    out = tmp_path / "both.png"
    code, _, err = run_cli(capsys, "plot", str(new), str(old), "-o", str(out))
    assert code == 0, err
    assert_not_blank(decoded_png(out))
    (old / "metrics.jsonl").write_text('{"update": 1, "loss": 2}\nnot json\n{"update": 3, "loss": 1}\n')
    code, _, err = run_cli(capsys, "plot", str(old), "-o", str(out))
    assert code == 2 and f"{old / 'metrics.jsonl'}:2:" in err and err.count("\n") == 1


def test_without_matplotlib_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "update": 1, "wall": 1.0, "loss": 2.0}\n')
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` now raises ImportError
    code, _, err = run_cli(capsys, "plot", str(run), "-o", str(tmp_path / "c.png"))
    assert code == 2 and 'pip install -e ".[viz]"' in err and err.count("\n") == 1
    assert not (tmp_path / "c.png").exists()
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML % ("pre", "sinusoidal", "true", "true"))
    code, out, err = run_cli(capsys, "inspect", str(path))  # the text report needs no matplotlib
    assert code == 0 and "parameters:" in out, err
