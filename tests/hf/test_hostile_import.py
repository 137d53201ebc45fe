"""Hostile MarianMT directories: a valid one (a tiny random MarianMTModel with its MarianTokenizer, written by
save_pretrained) with one of its files changed as a stranger could: config.json's fields of the wrong type, huge,
zero, negative or missing, the whole file replaced by other JSON or nested deep; vocab.json, tokenizer_config.json
and generation_config.json likewise; the weights split into shards whose index names other files, or stored as
pytorch_model.bin; tensors dropped, renamed, added, reshaped (a zero-width table of 5e7 rows among them) or of
another dtype; the safetensors file truncated or its header rewritten. Then `tmt import` in this process.

Every case must either import, and the checkpoint it writes then translate (every later command accepts what the
import writes), or be refused with exit code 2 and one `tmt: error:` line that names the file and the field or
tensor at fault, no traceback; each within the memory bound of tests/hostile.py (the address space capped at
what the process maps plus MEMORY_BOUND_MIB, the resident growth measured).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from tests.conftest import head
from tests.hf.conftest import MarianDir
from tests.hostile import Outcome, assert_refused_in_one_line, assert_within_memory, examples, memory_limit, run_tmt

__all__ = ["memory_limit"]  # the fixture, used by name

SUITE = "marian-hf"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"
BIG = [2**31, 2**40, 2**63, 10**300, -(2**63), -1, 0, 1, 2, 3]
# values of every wrong kind for a JSON field (in range or not: `numbers` draws those)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(BIG),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["x" * 100_000, "marian", "relu", "<unk>", "</s>", "<pad>", "1", "../x", "/etc/passwd"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-2, 2), max_size=2),
    st.builds(lambda n: [[[0]]] * n, st.integers(0, 2)),
)
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(-1e30, 1e30, allow_nan=False), st.integers(-3, 600))
# files that are not a JSON object: other JSON, not JSON, not UTF-8, nested past Python's parser
not_an_object = st.sampled_from(
    [
        "[]",
        "null",
        "12",
        '"config"',
        "",
        "{",
        "{}" * 2,
        b"\xff\xfe{}",
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 50_000 + "1" + "}" * 50_000,
    ]
)


@dataclass
class Case:
    """One mutated directory: its path, what its refusal may name, and the JSON and tensors written into it."""

    path: Path
    names: list[str] = field(
        default_factory=list
    )  # one of these must be in a refusal (the field, the tensor, the file)


class Pristine(dict):
    """The valid directory's parsed files and tensors; shown by name in Hypothesis's report of a failing case."""

    def __repr__(self) -> str:
        return "<the tiny MarianMT directory>"


@pytest.fixture(scope="module")
def base(marian_dir: MarianDir) -> Pristine:
    from safetensors.torch import load_file

    files = {name: json.loads((marian_dir.path / name).read_text(encoding="utf-8")) for name in JSON_FILES}
    return Pristine(dir=marian_dir.path, weights=load_file(str(marian_dir.path / "model.safetensors")), **files)


JSON_FILES = ("config.json", "vocab.json", "tokenizer_config.json", "generation_config.json")


@pytest.fixture(scope="module")
def source(tmp_path_factory, multi30k) -> Path:
    path = tmp_path_factory.mktemp("hostile_marian_src") / "src.en"
    path.write_text("\n".join(head(multi30k / "val.en", 2)) + "\n", encoding="utf-8")
    return path


def write(path: Path, data: Any) -> None:
    """Write ``data`` (JSON, text or bytes) to ``path`` as a new file: the other files of a case are hard links to
    the valid directory's, which must stay as they are."""
    path.unlink(missing_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


def save_weights(case: Path, weights: dict[str, torch.Tensor], layout: str) -> None:
    """The tensors as model.safetensors, as two shards with their index, or as pytorch_model.bin."""
    from safetensors.torch import save_file

    (case / "model.safetensors").unlink()
    if layout == "single":
        save_file(weights, str(case / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "bin":
        torch.save(weights, case / "pytorch_model.bin")
    else:
        names = sorted(weights)
        halves = {SHARDS[0]: names[: len(names) // 2], SHARDS[1]: names[len(names) // 2 :]}
        for shard, part in halves.items():
            save_file({n: weights[n] for n in part}, str(case / shard), metadata={"format": "pt"})
        write(case / INDEX, {"metadata": {}, "weight_map": {n: shard for shard, part in halves.items() for n in part}})


def new_case(base: Pristine, tmp_path_factory) -> Case:
    path = tmp_path_factory.mktemp("marian_case") / "hf"
    shutil.copytree(base["dir"], path, copy_function=os.link)
    return Case(path)


# ---------------------------------------------------------------- mutations
# Each changes a case and says what a refusal may name.
CONFIG_KEYS_ABSENT = [
    "model_type",
    "normalize_before",
    "static_position_embeddings",
    "add_final_layer_norm",
    "layernorm_embedding",
    "bos_token_id",
]


def config_field(base, case: Case, data) -> None:
    config = dict(base["config.json"])
    key = data.draw(st.sampled_from(sorted(config) + CONFIG_KEYS_ABSENT), label="key")
    how = data.draw(st.sampled_from(["junk", "number", "drop"]), label="how")
    if how == "drop":
        config.pop(key, None)
    else:
        config[key] = data.draw(junk if how == "junk" else numbers, label="value")
    write(case.path / "config.json", config)
    # a value of the right type may make a model whose tensors the file does not hold (named by the tensor), or
    # one above the size bound; a token id may disagree with the tokenizer's piece (named by the field's piece)
    case.names = [
        "config.json",
        key,
        "model.safetensors",
        "parameters",
        "sinusoid table",
        key.removesuffix("_id"),
        "decoder_vocab_size",
    ]


def config_sizes(base, case: Case, data) -> None:
    """Sizes that agree with one another (so each passes its own check) but not with the stored tensors, or make
    a model past the bound: refused before it is allocated."""
    config = dict(base["config.json"])
    heads = data.draw(st.sampled_from([1, 2, 4, 8, 1024]), label="heads")
    d_model = heads * data.draw(st.sampled_from([1, 8, 64, 4096]), label="head size")
    layers = data.draw(st.sampled_from([0, 1, 2, 3, 1024]), label="layers")
    ffn = data.draw(st.sampled_from([1, 64, 1 << 20]), label="ffn")
    positions = data.draw(st.sampled_from([2, 128, 1 << 20]), label="positions")
    config.update(
        d_model=d_model,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=positions,
    )
    write(case.path / "config.json", config)
    case.names = ["config.json", "model.safetensors", "d_model", "layers", "ffn", "heads", "max_position_embeddings"]


def json_file(base, case: Case, data) -> None:
    """A whole file that is not what it should be: other JSON, not JSON, nested deep, or a field of it changed."""
    name = data.draw(st.sampled_from(JSON_FILES), label="file")
    how = data.draw(st.sampled_from(["replace", "field"] if name != "config.json" else ["replace"]), label="how")
    if how == "replace":
        write(case.path / name, data.draw(not_an_object, label="text"))
        case.names = [name]
        return
    content = dict(base[name])
    keys = sorted(content)[:40] + {
        "tokenizer_config.json": ["separate_vocabs", "unk_token", "eos_token", "pad_token"],
        "generation_config.json": ["num_beams"],
    }.get(name, [])
    key = data.draw(st.sampled_from(keys), label="key")
    content[key] = data.draw(st.one_of(junk, numbers, st.builds(lambda s: {"content": s}, junk)), label="value")
    write(case.path / name, content)
    # vocab.json: a piece's id; the tokenizer's pieces: refused where they are looked up (vocab.json) or by the
    # config field that names their id
    case.names = [name, key if len(key) < 40 else "piece", "vocab.json", "_token_id", "sentencepiece"]


def vocab(base, case: Case, data) -> None:
    table = dict(base["vocab.json"])
    how = data.draw(st.sampled_from(["drop", "extra", "rename", "duplicate", "huge-piece", "shift"]), label="how")
    piece = data.draw(st.sampled_from(sorted(table)[:20] + ["</s>", "<unk>", "<pad>"]), label="piece")
    if how == "drop":
        del table[piece]
    elif how == "extra":
        table["new-piece"] = len(table)
    elif how == "rename":
        table["renamed-" + piece] = table.pop(piece)
    elif how == "duplicate":
        table["dup"] = table[piece]
    elif how == "huge-piece":
        table["p" * 100_000] = table.pop(piece)
    else:
        table = {p: i + 1 for p, i in table.items()}
    write(case.path / "vocab.json", table)
    case.names = ["vocab.json", "vocab_size", "_token_id"]


def tensors(base, case: Case, data) -> None:
    weights = dict(base["weights"])
    name = data.draw(st.sampled_from(sorted(weights) + ["model.encoder.embed_positions.weight"]), label="tensor")
    t = weights.get(name, torch.zeros(128, 32))
    how = data.draw(
        st.sampled_from(
            [
                "drop",
                "rename",
                "extra",
                "transposed",
                "flattened",
                "empty",
                "zero-width",
                "bigger",
                "float16",
                "bfloat16",
                "float64",
                "int64",
                "bool",
                "uint8",
                "sinusoids",
            ]
        ),
        label="how",
    )
    if how == "drop":
        weights.pop(name, None)
    elif how == "rename":
        weights[name + ".renamed"] = weights.pop(name, t)
    elif how == "extra":
        name = data.draw(
            st.sampled_from(
                ["x", "model.encoder.layers.9.fc1.weight", "lm_head.weight", "n" * 10_000, "model.shared.weight"]
            )
        )
        weights[name] = torch.zeros(3)
    elif how == "sinusoids":  # MarianMT's own table: imported (compared with tmt's), or a copy that is not it
        from transformer_mt.model import sinusoids

        table = sinusoids(128, 32, layout="halves")
        weights["model.encoder.embed_positions.weight"] = data.draw(
            st.sampled_from([table, table + 0.01, table[:, torch.randperm(32)]])
        )
        name = "model.encoder.embed_positions.weight"
    else:
        weights[name] = {
            "transposed": lambda: t.t().contiguous() if t.dim() == 2 else t[None],
            "flattened": lambda: t.flatten() if t.dim() > 1 else t[None],
            "empty": lambda: t.new_zeros((0, *t.shape[1:])),
            "zero-width": lambda: torch.zeros(50_000_000, 0),
            "bigger": lambda: torch.zeros(t.shape[0] + 1, *t.shape[1:]),
            "float16": t.half,
            "bfloat16": t.bfloat16,
            "float64": t.double,
            "int64": t.long,
            "bool": t.bool,
            "uint8": lambda: t.to(torch.uint8),
        }[how]()
    layout = data.draw(st.sampled_from(["single", "shards", "bin"]), label="layout")
    save_weights(case.path, weights, layout)
    case.names = [name if len(name) < 100 else "n...", "model.safetensors", *SHARDS, "pytorch_model.bin"]


def index(base, case: Case, data) -> None:
    """Two shards and an index whose weight_map is of the wrong form or names other files."""
    save_weights(case.path, dict(base["weights"]), "shards")
    weight_map = json.loads((case.path / INDEX).read_text(encoding="utf-8"))["weight_map"]
    how = data.draw(
        st.sampled_from(["value", "drop", "extra", "swap", "weight_map", "outside", "link", "missing-shard"]),
        label="how",
    )
    tensor = data.draw(st.sampled_from(sorted(weight_map)), label="tensor")
    outside = case.path.parent / "outside.safetensors"
    shutil.copy(case.path / SHARDS[0], outside)
    if how == "value":
        weight_map[tensor] = data.draw(
            st.one_of(
                junk,
                st.sampled_from(
                    [str(outside), "../outside.safetensors", ".", "", "sub/../" + SHARDS[0], SHARDS[0] + "/"]
                ),
            )
        )
    elif how == "drop":
        del weight_map[tensor]
    elif how == "extra":
        weight_map["model.extra.weight"] = SHARDS[0]
    elif how == "swap":
        weight_map[tensor] = SHARDS[1] if weight_map[tensor] == SHARDS[0] else SHARDS[0]
    elif how == "weight_map":
        weight_map = data.draw(junk)
    elif how == "outside":
        weight_map[tensor] = "outside.safetensors"
        (case.path / "outside.safetensors").symlink_to(outside)
    elif how == "link":  # a link inside the directory to a file inside it: allowed
        (case.path / "alias.safetensors").symlink_to(case.path / SHARDS[0])
        weight_map = {n: "alias.safetensors" if s == SHARDS[0] else s for n, s in weight_map.items()}
    else:
        (case.path / SHARDS[1]).unlink()
    write(case.path / INDEX, {"metadata": {}, "weight_map": weight_map})
    case.names = [INDEX, *SHARDS]


def weight_bytes(base, case: Case, data) -> None:
    """model.safetensors truncated, its header length or header rewritten to claim other sizes and offsets."""
    raw = (case.path / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    how = data.draw(st.sampled_from(["truncate", "header-size", "shape", "offsets", "dtype", "garbage"]), label="how")
    name = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")), label="tensor")
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    elif how == "header-size":
        raw = data.draw(st.sampled_from([2**63, 2**40, size + 1, 0])).to_bytes(8, "little") + raw[8:]
    elif how == "garbage":
        raw = raw[:8] + b"\xff" * size + raw[8 + size :]
    else:
        entry = header[name]
        if how == "shape":
            entry["shape"] = data.draw(
                st.sampled_from([[50_000_000, 0], [2**40, 2**40], [-1], [], [*entry["shape"], 1]])
            )
        elif how == "offsets":
            entry["data_offsets"] = data.draw(st.sampled_from([[0, 2**62], [5, 1], [0, 0]]))
        else:
            entry["dtype"] = data.draw(st.sampled_from(["I64", "BOOL", "F8_E4M3", "C64", "X"]))
        text = json.dumps(header).encode()
        raw = len(text).to_bytes(8, "little") + text + raw[8 + size :]
    write(case.path / "model.safetensors", raw)
    case.names = ["model.safetensors"]


MUTATIONS: dict[str, Callable[[Pristine, Case, Any], None]] = {
    "config-field": config_field,
    "config-sizes": config_sizes,
    "json-file": json_file,
    "vocab": vocab,
    "tensor": tensors,
    "index": index,
    "weight-bytes": weight_bytes,
}


def check(outcome: Outcome, case: Case, out: Path, source: Path) -> None:
    """Imported, and the checkpoint translates (one line per input line); or refused in one line naming a file of
    the directory and one of the case's names."""
    if outcome.code == 0:
        assert_within_memory(outcome)
        translated = run_tmt(
            ["translate", source, "-c", out, "--device", "cpu", "--threads", "1", "--beam", "1"],
            suite=f"{SUITE} translate",
        )
        assert translated.code == 0, f"the import wrote a checkpoint `tmt translate` refuses: {translated.err[-2000:]}"
        assert translated.out.count("\n") == 2, translated.out
        return
    assert_refused_in_one_line(outcome, names=[case.path])
    line = outcome.err.splitlines()[0].removeprefix(f"tmt: error: {case.path}")
    assert any(name in line for name in case.names), f"none of {case.names} in: {outcome.err}"
    assert not out.exists()


def _run(base, source, tmp_path_factory, data, mutations: list[str]) -> None:
    case = new_case(base, tmp_path_factory)
    mutation = data.draw(st.sampled_from(mutations), label="mutation")
    MUTATIONS[mutation](base, case, data)
    out = case.path.parent / "model.pt"
    outcome = run_tmt(["import", case.path, "--from", "marian-hf", "-o", out], suite=SUITE)
    event(f"{mutation}: {'imported' if outcome.code == 0 else 'refused'}")  # pytest --hypothesis-show-statistics
    check(outcome, case, out, source)


@pytest.mark.usefixtures("memory_limit")
@examples(110)
@given(data=st.data())
def test_a_mutated_config_imports_or_is_refused_in_one_line(base, source, tmp_path_factory, data):
    _run(base, source, tmp_path_factory, data, ["config-field", "config-sizes", "json-file", "vocab"])


@pytest.mark.usefixtures("memory_limit")
@examples(110)
@given(data=st.data())
def test_mutated_weights_import_or_are_refused_in_one_line(base, source, tmp_path_factory, data):
    _run(base, source, tmp_path_factory, data, ["tensor", "index", "weight-bytes"])


def test_the_valid_directory_imports_in_each_weight_layout(base, source, tmp_path_factory):
    """The suite's starting point: without a mutation, every layout imports and translates (so that the refusals
    above are the mutations', not the harness')."""
    for layout in ("single", "shards", "bin"):
        case = new_case(base, tmp_path_factory)
        save_weights(case.path, dict(base["weights"]), layout)
        out = case.path.parent / "model.pt"
        outcome = run_tmt(["import", case.path, "--from", "marian-hf", "-o", out], suite=SUITE)
        assert outcome.code == 0, outcome.err
        check(outcome, case, out, source)
