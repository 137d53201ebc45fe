"""The exponential moving average of the weights (train.ema_decay, ema.py): the running average by hand, and a
tiny run whose validation, checkpoints, decoding, averaging and exact resume use it."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import head, make_checkpoint, run_cli, run_config
from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, save_checkpoint
from transformer_mt.decoding import translate_ids
from transformer_mt.model import Transformer
from transformer_mt.text import BOS_ID, EOS_ID, Tokenizer
from transformer_mt.training import EMA, resumed_config, train

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=4",
    "model.d_ff=64",
    "train.threads=1",
    "train.max_tokens=300",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.003",
    "train.warmup_updates=5",
    "train.best_metric=loss",
    "train.valid_bleu_sentences=-1",
    "train.log_every=5",
]


class Tied(nn.Module):
    """Two names for one weight (as shared embeddings), one more parameter and an integer buffer."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(3, dtype=dtype))
        self.b = self.a
        self.c = nn.Parameter(torch.zeros(2, dtype=dtype))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.long))


def by_hand(decay: float, sequence: list[list[float]], start: list[float]) -> list[float]:
    """The running average in Python floats: decay_t = min(decay, (1 + t) / (10 + t)) for update t = 0, 1, ..."""
    avg = list(start)
    for t, weights in enumerate(sequence):
        d = min(decay, (1 + t) / (10 + t))
        avg = [d * s + (1 - d) * w for s, w in zip(avg, weights)]
    return avg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ema_equals_a_running_average_by_hand(dtype):
    # decay 0.5: the warm-up's (1 + t) / (10 + t) is below 0.5 for t < 8, so both regimes are crossed in 12 updates
    model = Tied(dtype)
    start = [0.5, -1.0, 2.0, 0.25, 4.0]  # a (3), c (2): exact in bfloat16 too
    with torch.no_grad():
        model.a.copy_(torch.tensor(start[:3]))
        model.c.copy_(torch.tensor(start[3:]))
    ema = EMA(model, decay=0.5)
    sequence = [
        [float(k + i) * (-1) ** i / 4 for i in range(5)] for k in range(12)
    ]  # multiples of 1/4: exact in bfloat16
    for weights in sequence:
        with torch.no_grad():
            model.a.copy_(torch.tensor(weights[:3]))
            model.c.copy_(torch.tensor(weights[3:]))
        ema.update()
    expected = by_hand(0.5, sequence, start)
    exported = ema.export_state_dict()
    assert exported.keys() == {"a", "b", "c", "steps"} and exported["a"].dtype == dtype
    got = ema.state_dict()["weights"]
    assert got["a"].dtype == torch.float32 and ema.updates == 12
    assert got["a"].tolist() + got["c"].tolist() == pytest.approx(expected, rel=1e-6)
    assert got["b"].tolist() == got["a"].tolist()  # the tied name carries the same average
    # applied(): the average inside (rounded to the parameter dtype), the raw weights bit for bit after
    raw = [model.a.detach().clone(), model.c.detach().clone()]
    with ema.applied() as inside:
        assert torch.equal(cast(torch.Tensor, inside.a), got["a"].to(dtype))
        assert torch.equal(cast(torch.Tensor, inside.c), got["c"].to(dtype))
    assert torch.equal(model.a, raw[0]) and torch.equal(model.c, raw[1])


def test_ema_state_round_trip_continues_the_warm_up():
    """4 updates, state_dict into a fresh EMA, 4 more == 8 updates in one EMA, bit for bit (the count drives the
    warm-up)."""
    steps = [torch.randn(3, generator=torch.Generator().manual_seed(k)) for k in range(8)]

    def run(model: Tied, ema: EMA, values: list) -> None:
        for v in values:
            with torch.no_grad():
                model.a.copy_(v)
            ema.update()

    whole_model = Tied()
    whole = EMA(whole_model, decay=0.9)
    run(whole_model, whole, steps)
    first_model = Tied()
    first = EMA(first_model, decay=0.9)
    run(first_model, first, steps[:4])
    second_model = Tied()
    second = EMA(second_model, decay=0.9)
    second.load_state_dict(first.state_dict())
    run(second_model, second, steps[4:])
    assert second.updates == 8
    assert torch.equal(second.state_dict()["weights"]["a"], whole.state_dict()["weights"]["a"])


# ---------------------------------------------------------------- a tiny run with EMA on
@pytest.fixture(scope="module")
def ema_run(pairs64, spm_model, tmp_path_factory) -> Path:
    """20 updates with train.ema_decay=0.99, validated (loss only) at updates 10 and 20."""
    out = tmp_path_factory.mktemp("ema_run") / "run"
    train(
        run_config(
            pairs64, spm_model, out, *TINY, "train.ema_decay=0.99", "train.max_updates=20", "train.validate_every=10"
        )
    )
    return out


def load_model(state: dict, tok: Tokenizer, weights: dict) -> Transformer:
    model = Transformer(
        config_from_checkpoint(state).model, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size
    )
    model.load_state_dict(weights)
    return model.eval()


def ema_weights(state: dict) -> dict:
    """The raw state_dict with every parameter the EMA holds replaced by its average (built here, not by
    checkpoint.py)."""
    return {name: state["ema"]["weights"].get(name, tensor) for name, tensor in state["model"].items()}


def nll_per_token(model: Transformer, src_lines: list[str], tgt_lines: list[str], tok: Tokenizer) -> float:
    """Teacher-forced negative log-likelihood per target token (pieces + EOS), one sentence at a time, no padding."""
    total, count = 0.0, 0
    with torch.no_grad():
        for src, tgt in zip(tok.encode(src_lines), tok.encode(tgt_lines)):
            logits = model(torch.tensor([src + [EOS_ID]]), torch.tensor([[BOS_ID] + tgt]))[0]  # (T, V)
            total += F.cross_entropy(logits.double(), torch.tensor(tgt + [EOS_ID]), reduction="sum").item()
            count += len(tgt) + 1
    return total / count


def test_checkpoints_hold_ema_weights_and_validation_used_them(ema_run, pairs64, spm_model):
    state = load_checkpoint(ema_run / "checkpoint_last.pt")
    assert state["ema"]["updates"] == 20 and state["progress"]["update"] == 20
    assert state["ema"]["weights"].keys() == {n for n, p in state["model"].items() if p.is_floating_point()}
    differ = [n for n, w in state["ema"]["weights"].items() if not torch.allclose(w, state["model"][n], atol=1e-4)]
    assert (
        len(differ) > len(state["ema"]["weights"]) // 2
    )  # 20 updates at decay_t <= 29/38 leave the average well behind
    tok = Tokenizer(spm_model)
    src, tgt = head(pairs64["val.en"], 16), head(pairs64["val.de"], 16)
    ema_nll = nll_per_token(load_model(state, tok, ema_weights(state)), src, tgt, tok)
    raw_nll = nll_per_token(load_model(state, tok, state["model"]), src, tgt, tok)
    assert state["metrics"]["val_nll"] == pytest.approx(ema_nll, rel=1e-5)
    assert abs(raw_nll - ema_nll) > 1e-2  # so the check above tells the two apart
    # the best checkpoint was chosen on the EMA weights' loss: the better of the two validations
    best = load_checkpoint(ema_run / "checkpoint_best.pt")
    at10 = load_checkpoint(ema_run / "checkpoint_10.pt")
    assert best["progress"]["best"] == min(at10["metrics"]["val_loss"], state["metrics"]["val_loss"])


def nbest_lines(model: Transformer, state: dict, tok: Tokenizer, lines: list[str]) -> list[tuple[str, float, str]]:
    d = config_from_checkpoint(state).decode
    hyps = translate_ids(
        model, tok.encode(lines), beam=2, lenpen=0.6, nbest=2, max_len_a=d.max_len_a, max_len_b=d.max_len_b
    )
    return [(str(i), h.score, tok.decode([h.tokens])[0]) for i, nbest in enumerate(hyps) for h in nbest]


def parse(out: str) -> list[tuple[str, float, str]]:
    return [(i, float(score), text) for i, score, text in (line.split("\t") for line in out.splitlines())]


def test_translate_weights_raw_and_ema_decode_the_respective_models(ema_run, pairs64, spm_model, tmp_path, capsys):
    ckpt = ema_run / "checkpoint_last.pt"
    state = load_checkpoint(ckpt)
    tok = Tokenizer(spm_model)
    lines = head(pairs64["val.en"], 3)
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outs = {}
    for choice in ("raw", "ema", None):
        code, out, err = run_cli(
            [
                "translate",
                "-c",
                ckpt,
                src,
                "--beam",
                "2",
                "--lenpen",
                "0.6",
                "--nbest",
                "2",
                "--device",
                "cpu",
                *(["--weights", choice] if choice else []),
            ],
            capsys,
        )
        assert code == 0, err
        outs[choice] = parse(out)
    for choice, weights in (("raw", state["model"]), ("ema", ema_weights(state))):
        expected = nbest_lines(load_model(state, tok, weights), state, tok, lines)
        assert [(i, t) for i, _, t in outs[choice]] == [(i, t) for i, _, t in expected]
        assert [s for _, s, _ in outs[choice]] == pytest.approx(
            [s for _, s, _ in expected], abs=2e-4
        )  # printed with 4 decimals
    assert outs[None] == outs["ema"]  # the default: the EMA weights, as validation chose on
    assert max(abs(a[1] - b[1]) for a, b in zip(outs["raw"], outs["ema"])) > 1e-2


def test_ema_asked_of_a_checkpoint_without_it_is_one_line(spm_model, tmp_path, capsys):
    ckpt = make_checkpoint(spm_model, tmp_path / "plain.pt")
    src = tmp_path / "in.en"
    src.write_text("a dog\n", encoding="utf-8")
    code, out, err = run_cli(["translate", "-c", ckpt, src, "--weights", "ema", "--device", "cpu"], capsys)
    assert code == 2 and out == ""
    assert (
        err == f"tmt: error: {ckpt}: --weights ema, but the checkpoint holds no EMA weights (train.ema_decay was 0); "
        "use --weights raw\n"
    )
    code, _, err = run_cli(["translate", "-c", ckpt, src, "--weights", "best", "--device", "cpu"], capsys)
    assert code == 2 and err == "tmt: error: --weights best: choose one of ema, raw\n"


def test_average_takes_ema_weights_when_every_input_has_them(ema_run, tmp_path, capsys):
    paths = [ema_run / "checkpoint_10.pt", ema_run / "checkpoint_20.pt"]
    states = [load_checkpoint(p) for p in paths]
    plain = tmp_path / "plain_10.pt"  # checkpoint_10 without its EMA weights
    save_checkpoint({k: v for k, v in states[0].items() if k != "ema"}, plain)
    cases = [
        (paths, [], [ema_weights(s) for s in states], "ema"),
        (paths, ["--weights", "raw"], [s["model"] for s in states], "raw"),
        ([plain, paths[1]], [], [s["model"] for s in states], "raw"),
    ]
    for k, (inputs, option, weights, kind) in enumerate(cases):
        out = tmp_path / f"avg{k}.pt"
        code, _, err = run_cli(["average", *inputs, "-o", out, *option], capsys)
        assert code == 0 and f"averaged the {kind} weights of 2 checkpoints" in err
        avg = load_checkpoint(out)
        assert "ema" not in avg and avg["averaged_weights"] == kind
        for name, tensor in avg["model"].items():
            torch.testing.assert_close(
                tensor, (weights[0][name].double() + weights[1][name].double()).div(2).float(), rtol=0, atol=0
            )
    code, _, err = run_cli(["average", plain, paths[1], "-o", tmp_path / "bad.pt", "--weights", "ema"], capsys)
    assert (
        code == 2 and err.count("\n") == 1 and f"{plain}: --weights ema, but the checkpoint holds no EMA weights" in err
    )


def test_inspect_loads_the_ema_weights_that_translate_decodes_with(ema_run):
    from transformer_mt.viz.inspect import load_model as inspect_model

    state = load_checkpoint(ema_run / "checkpoint_last.pt")
    model = inspect_model(ema_run / "checkpoint_last.pt")[0]
    expected = ema_weights(state)
    assert any(not torch.equal(expected[n], state["model"][n]) for n in state["ema"]["weights"])  # the two differ
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)


@pytest.mark.slow
def test_resume_with_ema_is_exact(pairs64, spm_model, tmp_path):
    """4 + 4 updates == 8 updates, bit for bit: weights, optimizer moments and the EMA (weights and count), with
    dropout and validations (which swap the EMA weights in and out) on the way."""
    common = [*TINY, "train.ema_decay=0.9", "model.dropout=0.1", "train.validate_every=2"]
    train(run_config(pairs64, spm_model, tmp_path / "a", *common, "train.max_updates=8"))
    train(run_config(pairs64, spm_model, tmp_path / "b", *common, "train.max_updates=4"))
    train(resumed_config(tmp_path / "b", ["train.max_updates=8"]), resume=True)
    a, b = (load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("a", "b"))
    assert a["ema"]["updates"] == b["ema"]["updates"] == 8
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        if key in a["ema"]["weights"]:
            assert torch.equal(a["ema"]["weights"][key], b["ema"]["weights"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert a["metrics"] == b["metrics"]


def test_resume_without_ema_in_the_checkpoint_starts_the_average_there(pairs64, spm_model, tmp_path):
    train(run_config(pairs64, spm_model, tmp_path / "r", *TINY, "train.max_updates=2", "train.validate_every=100"))
    start = load_checkpoint(tmp_path / "r" / "checkpoint_last.pt")
    assert "ema" not in start
    train(resumed_config(tmp_path / "r", ["train.max_updates=3", "train.ema_decay=0.9"]), resume=True)
    end = load_checkpoint(tmp_path / "r" / "checkpoint_last.pt")
    assert end["ema"]["updates"] == 1
    # one update at decay_0 = min(0.9, 1/10): 0.1 of the resumed weights, 0.9 of the new ones
    for name, avg in end["ema"]["weights"].items():
        torch.testing.assert_close(avg, 0.1 * start["model"][name] + 0.9 * end["model"][name], rtol=1e-5, atol=1e-6)
    assert "holds no EMA weights; the average starts from its weights" in (tmp_path / "r" / "train.log").read_text()


def test_ema_off_writes_no_ema_key(pairs64, spm_model, tmp_path):
    cfg = run_config(pairs64, spm_model, tmp_path / "off", *TINY, "train.max_updates=1", "train.validate_every=100")
    assert cfg.train.ema_decay == 0.0  # the default
    train(cfg)
    assert "ema" not in load_checkpoint(tmp_path / "off" / "checkpoint_last.pt")
