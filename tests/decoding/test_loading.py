"""Checkpoints nobody here wrote, through `tmt translate -c`: each is refused in one line before anything is
allocated (``decoding.loading.model_from_checkpoint`` and ``decoding.rebuild``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_checkpoint, run_cli
from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, save_checkpoint
from transformer_mt.model import Transformer


@pytest.fixture(scope="module")
def ckpt(spm_model, tmp_path_factory) -> Path:
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("ckpt") / "model.pt")


def crafted(base: Path, path: Path, change) -> Path:
    """A copy of checkpoint `base` with `change(state)` applied, saved at `path`."""
    state = load_checkpoint(base)
    change(state)
    save_checkpoint(state, path)
    return path


def refused_line(path: Path, capsys) -> str:
    """`tmt translate -c PATH` under a 1.5 GiB address-space cap: the one `tmt: error:` line it must print, exit 2."""
    from tests.hostile import address_space_limit

    source = path.parent / "source.txt"
    source.write_text("A man rides a horse.\n", encoding="utf-8")
    with address_space_limit():
        code, out, err = run_cli(["translate", source, "-c", path, "--device", "cpu"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("tmt: error: ") and "Traceback" not in err, err[-3000:]
    assert str(path) in err and len(err) <= 600, err
    return err


def test_checkpoint_asking_for_more_than_its_bytes_is_refused_before_allocating(ckpt, tmp_path, capsys):
    # 3.3e10 parameters (123 GiB) under the old bound of 1e11; the file holds a model of 0.2 MB
    path = crafted(
        ckpt,
        tmp_path / "huge.pt",
        lambda s: s["config"]["model"].update(d_model=65536, d_ff=65536, heads=1, max_positions=64),
    )
    err = refused_line(path, capsys)
    assert "parameters" in err

    # within the parameter bound, and every tensor of the right shape, but all of them views of one storage:
    # the model needs 6.3M numbers (25 MB), the file holds 1M (4 MB)
    def one_storage(state):
        state["config"]["model"].update(d_model=512, heads=8, d_ff=1024)
        with torch.device("meta"):
            model = Transformer(config_from_checkpoint(state).model, src_vocab_size=1000, tgt_vocab_size=1000)
        shapes = {name: t.shape for name, t in model.state_dict().items()}
        storage = torch.zeros(max(shape.numel() for shape in shapes.values()))
        state["model"] = {name: storage[: shape.numel()].view(shape) for name, shape in shapes.items()}

    path = crafted(ckpt, tmp_path / "shared.pt", one_storage)
    err = refused_line(path, capsys)
    assert "bytes" in err


def test_parameter_bound_counts_the_tokenizers_real_vocabulary(ckpt, tmp_path, capsys, monkeypatch):
    from transformer_mt.config import checks

    # The config says 8 pieces, the tokenizer it holds has 1000: the bound must count 1000 rows per table.
    path = crafted(ckpt, tmp_path / "vocab.pt", lambda s: s["config"]["tokenizer"].update(vocab_size=8))
    monkeypatch.setattr(
        checks, "MAX_PARAMETERS", 40_000
    )  # the model holds 55,424 numbers with 1000 pieces; 8 would make ~24k
    err = refused_line(path, capsys)
    assert "1,000" in err and "parameters" in err


def test_weights_that_do_not_fit_are_named_one_tensor_with_both_shapes(ckpt, tmp_path, capsys):
    path = crafted(
        ckpt, tmp_path / "shape.pt", lambda s: s["model"].__setitem__("encoder.0.ffn.fc1.weight", torch.zeros(64, 16))
    )
    err = refused_line(path, capsys)
    assert "encoder.0.ffn.fc1.weight" in err and "(64, 16)" in err and "(64, 32)" in err
    path = crafted(
        ckpt, tmp_path / "layers.pt", lambda s: s["config"]["model"].update(encoder_layers=3)
    )  # 24 tensors missing
    err = refused_line(path, capsys)
    assert "encoder.1." in err and "encoder.2." not in err
    path = crafted(
        ckpt,
        tmp_path / "dtype.pt",
        lambda s: s["model"].__setitem__("encoder.0.ffn.fc1.bias", torch.zeros(64, dtype=torch.int64)),
    )
    err = refused_line(path, capsys)
    assert "encoder.0.ffn.fc1.bias" in err and "int64" in err


def test_a_tensor_viewing_more_numbers_than_it_stores_is_refused(ckpt, tmp_path, capsys):
    # a (1000, 32) embedding whose 32,000 numbers are one float repeated (stride 0): 4 bytes in the file
    one = torch.zeros(1).expand(1000, 32)
    path = crafted(
        ckpt,
        tmp_path / "stride.pt",
        lambda s: s["model"].update({"src_embed.weight": one, "tgt_embed.weight": one, "output_proj.weight": one}),
    )
    err = refused_line(path, capsys)
    assert "src_embed.weight" in err or "tgt_embed.weight" in err or "output_proj.weight" in err


@pytest.mark.parametrize(
    "name, change, names",
    [
        ("ema-decay-only", lambda s: s.__setitem__("ema", {"decay": 0.9}), ["ema"]),
        ("ema-weights-list", lambda s: s.__setitem__("ema", {"decay": 0.9, "updates": 1, "weights": [1]}), ["ema"]),
        (
            "ema-weight-shape",
            lambda s: s.__setitem__(
                "ema", {"decay": 0.9, "updates": 1, "weights": {"src_embed.weight": torch.zeros(3)}}
            ),
            ["src_embed.weight"],
        ),
        ("model-null", lambda s: s["config"].__setitem__("model", None), ["model"]),
        ("model-list", lambda s: s["config"].__setitem__("model", [1, 2]), ["model"]),
        ("key-int", lambda s: s["config"]["model"].__setitem__(5, 1), ["model.5"]),
        ("dropout-str", lambda s: s["config"]["model"].__setitem__("dropout", "x"), ["model.dropout"]),
        ("dropout-null", lambda s: s["config"]["model"].__setitem__("dropout", None), ["model.dropout"]),
        ("heads-zero", lambda s: s["config"]["model"].__setitem__("heads", 0), ["model.heads"]),
        ("layers-bool", lambda s: s["config"]["model"].__setitem__("encoder_layers", True), ["model.encoder_layers"]),
        ("tokenizer-str", lambda s: s["tokenizers"].__setitem__("src", "not a tensor"), ["src"]),
        ("tokenizers-tensor", lambda s: s.__setitem__("tokenizers", torch.zeros(3)), ["tokenizers"]),
        ("weights-str", lambda s: s["model"].__setitem__("src_embed.weight", "x"), ["src_embed.weight"]),
        ("weight-name-int", lambda s: s["model"].__setitem__(7, torch.zeros(1)), ["model"]),
        ("format-tensor", lambda s: s.__setitem__("format", torch.zeros(2, 2)), ["format"]),
        (
            "default-beam-too-wide",
            lambda s: s["config"]["decode"].__setitem__("beam", 600),
            ["decode.beam=600", "at most 499"],
        ),
        (
            "beam-wider-than-kept-pieces",
            lambda s: (
                s["config"]["model"].__setitem__("restrict_output", True),
                s["model"].__setitem__("output_ids", torch.arange(4)),
            ),
            ["decode.beam=3", "at most 1"],
        ),
    ],
)
def test_damaged_checkpoint_entries_are_refused_in_one_line(ckpt, tmp_path, capsys, name, change, names):
    path = tmp_path / f"{name}.pt"
    state = load_checkpoint(ckpt)
    change(state)
    torch.save(state, path)  # as a stranger would write it: save_checkpoint sets the format
    err = refused_line(path, capsys)
    for key in names:
        assert key in err, err
