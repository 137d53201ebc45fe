"""tmt inspect / plot / attention and the PE picture: counts, shapes and weights against independent computations."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import transformer_mt.cli.viz  # noqa: F401 - registers the commands (also done by transformer_mt.cli)
from transformer_mt.cli import main
from transformer_mt.config import load_config
from transformer_mt.model import Transformer

REPO = Path(__file__).resolve().parents[2]
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
        assert not isinstance(exc.code, str), exc.code  # tmt exits with a number
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def matched(pattern: str, text: str) -> re.Match[str]:
    """The first match of ``pattern`` in ``text``; it must be there."""
    found = re.search(pattern, text)
    assert found is not None, pattern
    return found


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


@pytest.mark.parametrize(
    "norm,positions,share_all,share_dec", [("post", "sinusoidal", "true", "true"), ("pre", "learned", "false", "false")]
)
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
    rows = {
        m.group(1): int(m.group(2).replace(",", ""))
        for m in re.finditer(r"^(\S+)\s+.*?\s([\d,]+)(?:\s{3}|$)", out, re.M)
    }
    assert rows["Transformer"] == expected
    top = [line for line in out.splitlines() if re.match(r"^  \S", line)]  # the model's direct children
    assert sum(int(matched(r"\s([\d,]+)(\s{3}|$)", line).group(1).replace(",", "")) for line in top) == expected
    # shapes from first principles: B=2, S=7, T=5, H=3, Dk=Dv=8
    assert (
        "Q (B, H, S, Dk) = (2, 3, 7, 8)" in out and "scores softmax(QK^T/sqrt(Dk)) (B, H, S, S) = (2, 3, 7, 7)" in out
    )
    assert "scores softmax(QK^T/sqrt(Dk)) (B, H, T, S) = (2, 3, 5, 7)" in out  # cross-attention
    decoder_self = matched(r"\(B, H, T, T\) = \(2, 3, 5, 5\)   mask (.*)", out).group(1)
    assert decoder_self in (
        "allowed (2, 1, 5, 5) bool, True = attend (causal + padding)",
        "causal (is_causal, no mask tensor)",
    )
    assert "(2, 5, 24) -> (2, 5, 60)" in out  # the output layer's logits


@pytest.mark.parametrize(
    "name,size,params", [("transformer_base.yaml", "base", 65), ("transformer_big.yaml", "big", 213)]
)
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
    from transformer_mt.decoding import Translator

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
    (new / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"kind": "train", "update": 10, "wall": 5.0, "loss": 7.0},
                {"kind": "valid", "update": 10, "wall": 6.0, "val_loss": 6.5, "val_bleu": 1.0},
                {"kind": "train", "update": 20, "wall": 9.0, "loss": 6.0},
                {"kind": "summary", "update": 20, "wall": 9.5, "target_tokens": 100},
            ]
        )
        + "\n"
    )
    # the last record was being written when the file was read
    (old / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"update": 10, "wall": 4.0, "loss": 7.5},
                {"update": 10, "wall": 4.5, "val_loss": 7.0},
                {"update": 20, "wall": 8.0, "loss": 6.5},
            ]
        )
        + "\n"
        + '{"update": 30, "wa'
    )
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


# ---------------------------------------------------------------- tmt attention
def independent_weights(model, src_ids: list[int], tgt_in_ids: list[int]) -> dict[str, list[torch.Tensor]]:
    """softmax(Q K^T / sqrt(d_k)) with the masks, in float64, from each layer's own input (read by hooks on a plain
    SDPA forward) and the model's W^Q, W^K, W^V; decoder layers are followed through their self-attention sublayer
    by hand to get the cross-attention queries."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [
        layer.register_forward_pre_hook(lambda _m, args, key=f"{stack}{i}": inputs.__setitem__(key, args[0].detach()))
        for stack in ("encoder", "decoder")
        for i, layer in enumerate(getattr(model, stack))
    ]
    src, tgt_in = torch.tensor([src_ids]), torch.tensor([tgt_in_ids])
    with torch.no_grad():
        memory = model.encode(src).memory.double()
        model.decode(tgt_in, model.encode(src))
    for h in hooks:
        h.remove()
    pre = model.cfg.norm == "pre"

    def heads(x, w, b, mha):  # (1, N, D) -> (1, H, N, d)
        return (x @ w.double().T + b.double()).view(1, x.size(1), mha.heads, -1).transpose(1, 2)

    def softmax(q, k, mask=None):
        scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
        return (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).softmax(-1)

    def norm(ln, x):
        return torch.nn.functional.layer_norm(x, ln.normalized_shape, ln.weight.double(), ln.bias.double(), ln.eps)

    out: dict[str, list[torch.Tensor]] = {"encoder_self": [], "decoder_self": [], "cross": []}
    for i, layer in enumerate(model.encoder):
        x = inputs[f"encoder{i}"].double()
        h = norm(layer.norm1, x) if pre else x
        wq, wk, _ = layer.self_attn.in_weight.split(layer.self_attn.sizes)
        bq, bk, _ = layer.self_attn.in_bias.split(layer.self_attn.sizes)
        out["encoder_self"].append(softmax(heads(h, wq, bq, layer.self_attn), heads(h, wk, bk, layer.self_attn))[0])
    t = len(tgt_in_ids)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i, layer in enumerate(model.decoder):
        x = inputs[f"decoder{i}"].double()
        sa, ca = layer.self_attn, layer.cross_attn
        h = norm(layer.norm1, x) if pre else x
        wq, wk, wv = sa.in_weight.split(sa.sizes)
        bq, bk, bv = sa.in_bias.split(sa.sizes)
        w = softmax(heads(h, wq, bq, sa), heads(h, wk, bk, sa), causal)
        out["decoder_self"].append(w[0])
        attn = (w @ heads(h, wv, bv, sa)).transpose(1, 2).reshape(
            1, t, -1
        ) @ sa.out.weight.double().T + sa.out.bias.double()
        x = x + attn if pre else norm(layer.norm1, x + attn)
        h = norm(layer.norm2, x) if pre else x
        wq, wk, _ = ca.in_weight.split(ca.sizes)
        bq, bk, _ = ca.in_bias.split(ca.sizes)
        out["cross"].append(softmax(heads(h, wq, bq, ca), heads(memory, wk, bk, ca))[0])
    return out


@pytest.fixture(scope="module")
def tiny_model(tiny_checkpoint):
    from transformer_mt.decoding import Translator

    return Translator.from_checkpoint(tiny_checkpoint, device="cpu")


def test_attention_json_equals_independent_computation(tmp_path, capsys, tiny_checkpoint, tiny_model, tiny_run):
    line = tiny_run.corpus["val.en"].read_text().splitlines()[3]
    code, out, err = run_cli(
        capsys, "attention", "-c", str(tiny_checkpoint), "--src", line, "-o", str(tmp_path / "maps")
    )
    assert code == 0, err
    data = json.loads((tmp_path / "maps" / "attention.json").read_text())
    sp = tiny_model.src_tok.sp
    src_ids = [sp.piece_to_id(p) for p in data["src_pieces"]]
    tgt_in_ids = [sp.piece_to_id(p) for p in data["tgt_in_pieces"]]
    # pieces + EOS; BOS + output
    assert src_ids[:-1] == tiny_model.src_tok.encode([line])[0] and src_ids[-1] == 3 and tgt_in_ids[0] == 2
    expected = independent_weights(tiny_model.model, src_ids, tgt_in_ids)
    s, t = len(src_ids), len(tgt_in_ids)
    for kind, shape in (("encoder_self", (4, s, s)), ("decoder_self", (4, t, t)), ("cross", (4, t, s))):
        got = torch.tensor(data[kind], dtype=torch.float64)  # (L, H, Q, K)
        assert got.shape == (2, *shape)
        torch.testing.assert_close(got, torch.stack(expected[kind]), atol=2e-5, rtol=0)
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1], dtype=torch.float64), atol=1e-5, rtol=0)
    dec = torch.tensor(data["decoder_self"])
    below = torch.ones(t, t, dtype=torch.bool).tril()
    # causal: exactly zero above the diagonal only
    assert bool((dec[..., ~below] == 0).all()) and bool((dec[..., below] > 0).all())
    for name in ("encoder_self", "decoder_self", "cross"):
        assert_not_blank(decoded_png(tmp_path / "maps" / f"{name}.png"))
    # the drawn translation is what `tmt translate` prints for that line (same checkpoint, same beam)
    (tmp_path / "in.en").write_text(line + "\n")
    code, _, err = run_cli(
        capsys, "translate", "-c", str(tiny_checkpoint), str(tmp_path / "in.en"), "-o", str(tmp_path / "out.de")
    )
    assert code == 0, err
    assert data["target"] == (tmp_path / "out.de").read_text().rstrip("\n") and not data["teacher_forced"]
    assert f"translation: {data['target']}" in out


def test_attention_options(tmp_path, capsys, tiny_checkpoint, tiny_model):
    src = tmp_path / "src.en"
    src.write_text("A dog runs.\nTwo children play in the snow.\n")
    ref = "Zwei Kinder spielen im Schnee."
    code, _, err = run_cli(
        capsys,
        "attention",
        "-c",
        str(tiny_checkpoint),
        str(src),
        "--line",
        "2",
        "--ref",
        ref,
        "--layers",
        "1",
        "--heads",
        "0,3",
        "--svg",
        "-o",
        str(tmp_path / "m"),
    )
    assert code == 0, err
    data = json.loads((tmp_path / "m" / "attention.json").read_text())
    assert data["source"] == "Two children play in the snow." and data["teacher_forced"] and data["target"] == ref
    assert data["tgt_out_pieces"] == tiny_model.tgt_tok.encode_pieces([ref])[0] + ["</s>"]
    assert (data["encoder_layers"], data["decoder_layers"], data["heads"]) == ([1], [1], [0, 3])
    full = run_cli(
        capsys,
        "attention",
        "-c",
        str(tiny_checkpoint),
        "--src",
        "Two children play in the snow.",
        "--ref",
        ref,
        "-o",
        str(tmp_path / "all"),
    )
    assert full[0] == 0
    everything = json.loads((tmp_path / "all" / "attention.json").read_text())
    for kind in ("encoder_self", "decoder_self", "cross"):
        assert torch.equal(torch.tensor(data[kind]), torch.tensor(everything[kind])[[1]][:, [0, 3]])
    assert (tmp_path / "m" / "cross.svg").read_text().lstrip().startswith("<?xml")
    for bad, needle in (
        (["--heads", "4"], "--heads 4: the model has 4 heads"),
        (["--layers", "x"], "--layers 'x'"),
        (["--line", "3"], "fewer than 3 lines"),
    ):
        args = ["attention", "-c", str(tiny_checkpoint), str(src), "-o", str(tmp_path / "bad")]
        args += [] if "--line" in bad else ["--line", "1"]
        code, _, err = run_cli(capsys, *args, *bad)
        assert code == 2 and needle in err and err.count("\n") == 1, err
    code, _, err = run_cli(
        capsys,
        "attention",
        "-c",
        str(tiny_checkpoint),
        "--src",
        "x",
        str(src),
        "--line",
        "1",
        "-o",
        str(tmp_path / "b"),
    )
    assert code == 2 and "either" in err


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("d", [128, 7])
def test_drawn_dimensions_are_sines_of_the_labelled_period(layout, d):
    from transformer_mt.model import sinusoids
    from transformer_mt.viz.positions import drawn_dimensions

    table = sinusoids(200, d, layout=layout)  # (200, d)
    pos = torch.arange(200, dtype=torch.float64)
    picks = drawn_dimensions(d, layout)
    assert len(picks) >= 3 and len({i for i, _ in picks}) == len(picks)
    for i, period in picks:
        assert period is not None
        torch.testing.assert_close(table[:, i].double(), torch.sin(2 * math.pi * pos / period), atol=1e-5, rtol=0)
    assert all(period is None for _, period in drawn_dimensions(d, None))
