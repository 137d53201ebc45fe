"""Hostile checkpoints: the tiny trained checkpoint with one of its parts mutated as a stranger could (config
values of the wrong type or size, tensors dropped, renamed, reshaped, retyped or made views of one number,
damaged EMA, optimizer, progress and tokenizer entries, the file truncated or its bytes flipped), then
`tmt translate` in this process. Every case must either translate (one output line per input line) or be
refused with exit code 2 and one `tmt: error:` line that names the file and the part at fault, no traceback,
within the memory bound of tests/hostile.py (the address space capped, the resident growth measured).

`tmt train --init-from` checks the weights it starts from the same way (decoding.rebuild), before it
builds the model: one crafted case below.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import head
from tests.hostile import Outcome, assert_refused_in_one_line, assert_within_memory, examples, memory_limit, run_tmt
from transformer_mt.checkpoint import load_checkpoint, save_checkpoint

__all__ = ["memory_limit"]  # the fixture, used by name

SUITE = "checkpoint"
BIG = [2**31, 2**40, 2**63 - 1, 2**63, 2**200, 10**5000, -(2**63), -1, 0]
# values of every wrong kind for a config key (the right kind, out of range, is drawn by `numbers`)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(BIG),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["x" * 100_000, "1e400", "nan", "[0.9, 0.98]", "0x10", " 12 ", "\n", "&a [*a]", "[" * 10_000]),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
    st.just(b"bytes"),
)
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(-1e30, 1e30), st.integers(-3, 70))


class Pristine(dict):
    """The tiny trained checkpoint's state; shown by name in Hypothesis's report of a failing case."""

    def __repr__(self) -> str:
        return "<the tiny trained checkpoint's state>"


@pytest.fixture(scope="module")
def base(tiny_checkpoint) -> Pristine:
    """The tiny trained checkpoint's state, read once; each case mutates a deep copy."""
    return Pristine(load_checkpoint(tiny_checkpoint))


@pytest.fixture(scope="module")
def source(tmp_path_factory, multi30k) -> Path:
    path = tmp_path_factory.mktemp("hostile_src") / "src.en"
    path.write_text("\n".join(head(multi30k / "val.en", 2)) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- mutations: each returns the words a refusal may name
def set_config(state, data) -> list[str]:
    section = data.draw(st.sampled_from(sorted(state["config"])), label="section")
    key = data.draw(st.sampled_from(sorted(state["config"][section])), label="key")
    value = data.draw(st.one_of(junk, numbers), label="value")
    state["config"][section][key] = value
    # a value of the right type may also be refused by a rule that names the other key it breaks, or make
    # a model whose tensors the file does not hold (the refusal then names the tensor)
    return [f"{section}.{key}", key, "weights do not fit", "tokenizer", "position table", "parameters"]


def break_config(state, data) -> list[str]:
    kind = data.draw(
        st.sampled_from(
            ["section-junk", "section-dropped", "unknown-key", "unknown-section", "non-str-key", "config-junk"]
        )
    )
    cfg = state["config"]
    section = data.draw(st.sampled_from(sorted(cfg)))
    if kind == "section-junk":
        cfg[section] = data.draw(junk)
        return [section]
    if kind == "section-dropped":  # its defaults (the base model) then meet the stored tensors
        del cfg[section]
        return ["weights do not fit", "tokenizer", "data.max_len", "model.", "parameters"]
    if kind == "unknown-key":
        cfg[section][data.draw(st.text(min_size=1, max_size=20))] = 1
        return [f"{section}."]
    if kind == "unknown-section":
        cfg[data.draw(st.text(min_size=1, max_size=20).filter(lambda s: s not in cfg))] = {}
        return ["unknown section"]
    if kind == "non-str-key":
        cfg[section][data.draw(st.one_of(st.integers(), st.tuples(st.integers())))] = 1
        return [f"{section}."]
    state["config"] = data.draw(junk)
    return ["config"]


def tensor_changes(t: torch.Tensor) -> dict[str, Any]:
    return {
        "transposed": t.t() if t.dim() == 2 else t[None],
        "flattened": t.flatten() if t.dim() > 1 else t[None],
        "empty": t.new_zeros((0, *t.shape[1:])),
        "int64": t.long(),
        "float16": t.half(),  # a floating kind: loadable
        "bool": t.bool(),
        "complex": t.to(torch.complex64) if t.is_floating_point() else t,
        "nan": torch.full_like(t, float("nan")) if t.is_floating_point() else t,
        "stride-0": t.reshape(-1)[:1].expand(t.shape) if t.numel() else t,
        "bigger": torch.zeros(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype) if t.dim() else t[None],
        "string": "not a tensor",
        "none": None,
    }


def mutate_tensor(state, data) -> list[str]:
    weights = state["model"]
    name = data.draw(st.sampled_from(sorted(weights)), label="tensor")
    kind = data.draw(st.sampled_from(["drop", "rename", "extra", "change"]), label="kind")
    if kind == "drop":
        del weights[name]
    elif kind == "rename":
        weights[name + ".renamed"] = weights.pop(name)
    elif kind == "extra":
        weights[data.draw(st.one_of(st.text(max_size=20), st.integers()))] = torch.zeros(3)
        return ["model", "is not part of the model"]
    else:
        change = data.draw(st.sampled_from(sorted(tensor_changes(weights[name]))), label="change")
        weights[name] = tensor_changes(weights[name])[change]
    return [name, "model"]


def mutate_entry(state, data) -> list[str]:
    """The entries `tmt translate` reads besides the config and the weights, and those it must ignore."""
    entry = data.draw(
        st.sampled_from(
            ["ema", "optimizer", "scheduler", "progress", "rng", "metrics", "tokenizers", "format", "src", "src_vocab"]
        )
    )
    if entry == "ema":
        raw = {k: v.clone() for k, v in state["model"].items() if k != "output_ids"}
        ema = data.draw(
            st.sampled_from(
                [
                    {"decay": 0.9},
                    {"decay": 0.9, "updates": 3, "weights": raw},  # a valid one: decoded with
                    {"decay": 0.9, "weights": {k: v[:1] for k, v in raw.items()}},
                    {"decay": 0.9, "weights": {"nope": torch.zeros(1)}},
                    {"weights": [1, 2]},
                    [],
                    "ema",
                    torch.zeros(2),
                ]
            )
        )
        state["ema"] = ema
        return ["ema", "EMA"]
    if entry in ("src", "src_vocab"):
        state["tokenizers"][entry] = data.draw(
            st.one_of(junk, st.just(torch.randint(0, 255, (64,), dtype=torch.uint8)), st.just(["a", "a", "b"]))
        )
        return ["tokenizer", "sentencepiece", entry]
    state[entry] = data.draw(junk)
    return [entry, "checkpoint", "sentencepiece", "tokenizers"]


def kept_ids(state, data) -> list[str]:
    """model.restrict_output turned on, with kept ids (`output_ids`, of a size only the checkpoint knows) drawn
    valid or not: unsorted, repeated, negative, past the vocabulary, of another dtype or shape."""
    state["config"]["model"]["restrict_output"] = True
    vocab = state["model"]["src_embed.weight"].shape[0]
    ids = data.draw(st.lists(st.integers(-2, vocab + 2), min_size=0, max_size=40), label="ids")
    if data.draw(st.booleans(), label="sorted"):
        ids = sorted(set(ids) | {0, 1, 2, 3})
    kept = torch.tensor(ids, dtype=torch.int64)
    state["model"]["output_ids"] = data.draw(
        st.sampled_from([kept, kept.int(), kept.float(), kept[None], kept.expand(2, -1)[0]]), label="as"
    )
    return ["output_ids", "decode.beam"]  # a valid set may be too small for the checkpoint's beam


MUTATIONS = {
    "config-value": set_config,
    "config-shape": break_config,
    "tensor": mutate_tensor,
    "entry": mutate_entry,
    "kept-ids": kept_ids,
}


def check(outcome: Outcome, path: Path, names: list[str]) -> None:
    """Translated (one line per input line), or refused in one line naming the file and one of `names`."""
    if outcome.code == 0:
        assert outcome.out.count("\n") == 2, outcome.out
        assert_within_memory(outcome)
        return
    assert_refused_in_one_line(outcome, names=[path])
    line = outcome.err.splitlines()[0].removeprefix(f"tmt: error: {path}")
    assert any(name in line for name in names) or "checkpoint" in line, f"none of {names} in: {outcome.err}"


@pytest.mark.usefixtures("memory_limit")
@examples(160)
@given(data=st.data())
def test_a_mutated_checkpoint_translates_or_is_refused_in_one_line(base, source, tmp_path_factory, data):
    state = copy.deepcopy(dict(base))
    mutation = data.draw(st.sampled_from(sorted(MUTATIONS)), label="mutation")
    names = MUTATIONS[mutation](state, data)
    path = tmp_path_factory.mktemp("case") / "hostile.pt"
    torch.save(state, path)  # as a stranger writes it: save_checkpoint would refuse some of it
    check(run_tmt(["translate", source, "-c", path, "--device", "cpu", "--threads", "1"], suite=SUITE), path, names)


@pytest.mark.usefixtures("memory_limit")
@examples(60)
@given(cut=st.floats(0.0, 1.0), flips=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=4))
def test_a_truncated_or_bit_flipped_checkpoint_translates_or_is_refused_in_one_line(
    tiny_checkpoint, source, tmp_path_factory, cut, flips
):
    data = bytearray(Path(tiny_checkpoint).read_bytes())
    for where, byte in flips:
        data[int(where * (len(data) - 1))] = byte
    path = tmp_path_factory.mktemp("case") / "cut.pt"
    path.write_bytes(bytes(data[: max(0, int(cut * len(data)) if cut < 0.9 else len(data))]))
    outcome = run_tmt(["translate", source, "-c", path, "--device", "cpu", "--threads", "1"], suite=SUITE)
    check(
        outcome,
        path,
        ["truncated or corrupt", "checkpoint", "weights do not fit", "tokenizer", "sentencepiece", "model", "config"],
    )


@pytest.mark.usefixtures("memory_limit")
def test_init_from_checks_the_weights_before_building_the_model(tiny_checkpoint, tiny_run, tmp_path):
    # 5.4e8 parameters (2.2 GB, past the 1.5 GiB cap of this test): within the parameter bound, but the file holds
    # tensors of d_model 32
    state = load_checkpoint(tiny_checkpoint)
    state["config"]["model"].update(d_model=4096, d_ff=4096, heads=8)
    crafted = save_checkpoint(state, tmp_path / "crafted.pt")
    corpus = tiny_run.corpus
    config = tmp_path / "finetune.yaml"
    config.write_text(
        f"data:\n  train_src: {corpus['train.en']}\n  train_tgt: {corpus['train.de']}\n"
        f"train:\n  out_dir: {tmp_path / 'run'}\n  device: cpu\n  max_updates: 1\n  threads: 1\n",
        encoding="utf-8",
    )
    outcome = run_tmt(["train", "--config", config, "--init-from", crafted], suite=SUITE)
    assert_refused_in_one_line(outcome, names=[crafted, "weights do not fit", "(1000, 32)", "(1000, 4096)"])
