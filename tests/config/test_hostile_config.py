"""Hostile YAML configs: configs/multi30k_small.yaml with one part mutated as a stranger could (a value of the
wrong type, huge, negative or nested; unknown and non-string keys; YAML tags, anchors, aliases and alias bombs,
numbers of thousands of digits, nesting thousands deep, syntax errors, bytes that are not UTF-8), then
`tmt inspect CONFIG`, the command that reads and validates a config (and builds its model on the meta
device) without training, in this process. Every case must either be accepted (exit 0) or be refused with
exit code 2 and one `tmt: error:` line that names the file and the key or line at fault, no traceback,
within the memory bound of tests/hostile.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.hostile import Outcome, assert_refused_in_one_line, assert_within_memory, examples, memory_limit, run_tmt
from transformer_mt.config import load_config, to_dict

__all__ = ["memory_limit"]  # the fixture, used by name

SUITE = "config"
REPO = Path(__file__).resolve().parents[2]
BASE = to_dict(load_config(REPO / "configs" / "multi30k_small.yaml", check_files=False))
KEYS = [(section, key) for section, values in BASE.items() for key in values]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# YAML-representable values of every kind, and numbers of the right kind out of range
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.integers(-(2**80), 2**80),
    st.sampled_from([2**31, 2**63, -(2**63) - 1, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["x" * 50_000, "1e400", "0.9,0.98", "[0.9, 0.98]", "[[[", "yes", "\u2028", "a\tb"]),
    st.lists(st.one_of(st.integers(-5, 5), st.floats(-2, 2), st.text(max_size=3)), max_size=5),
    st.dictionaries(st.text(max_size=6), st.integers(-5, 5), max_size=3),
    st.builds(nested, st.integers(2, 200)),
)

# raw YAML written in place of a value: tags, anchors, aliases, numbers Python cannot read, broken syntax
ALIAS_BOMB = (
    "[&a0 [x, x, x, x, x, x, x, x, x]"
    + "".join(f", &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10))
    + "]"
)
RAW_VALUES = [
    "!!python/object/apply:os.system ['echo owned']",
    "!!python/name:builtins.print",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2001-12-14",
    "2001-13-45",
    "!!float nan",
    "!!int '12'",
    "!!str 12",
    "!!omap [a: 1]",
    "!custom 3",
    "&anchor 8",
    "*undefined",
    ALIAS_BOMB,
    "9" * 5000,
    "-" + "9" * 5000,
    "0x" + "f" * 5000,
    "." + "9" * 5000,
    "[" * 5_000 + "]" * 5_000,
    "{a: " * 2_000 + "1" + "}" * 2_000,
    ".inf",
    "-.inf",
    ".nan",
    "0x1F",
    "0o17",
    "1_000",
    "~",
    "'unclosed",
    '"\\x"',
    "[1, 2",
    "{a: 1",
    "|\n    block\n    text",
    ">-\n    folded",
    "\n    nested: 1",
    "\n  - 1\n  - 2",
    "a: b: c",
    "\t3",
    "% percent",
    "@at",
]


def dump(raw: Any) -> str:
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)


def base_with(section: str, key: str, raw_value: str) -> str:
    """The base config's YAML with `section.key`'s value replaced by the raw text `raw_value`."""
    lines = []
    for sec, keys in BASE.items():
        lines.append(f"{sec}:")
        for k, v in keys.items():
            text = (
                raw_value
                if (sec, k) == (section, key)
                else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
            )
            lines.append(f"  {k}: {text}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- mutations: each gives the file's bytes and
# the words a refusal may name
def value_mutation(data) -> tuple[bytes, list[str]]:
    section, key = data.draw(st.sampled_from(KEYS), label="key")
    raw = copy.deepcopy(BASE)
    raw[section][key] = data.draw(values, label="value")
    # a value of the right type may break a rule between two keys: the refusal names both
    return dump(raw).encode(), [f"{section}.{key}"]


def raw_value_mutation(data) -> tuple[bytes, list[str]]:
    section, key = data.draw(st.sampled_from(KEYS), label="key")
    text = base_with(section, key, data.draw(st.sampled_from(RAW_VALUES), label="raw"))
    return text.encode(), [f"{section}.{key}", "line", "YAML", "nested", "unknown key"]


def key_mutation(data) -> tuple[bytes, list[str]]:
    raw: dict[Any, Any] = copy.deepcopy(BASE)
    kind = data.draw(
        st.sampled_from(["unknown-key", "unknown-section", "odd-key", "section-value", "duplicate", "complex-key"]),
        label="kind",
    )
    section = data.draw(st.sampled_from(sorted(BASE)), label="section")
    if kind == "unknown-key":
        name = data.draw(st.text(min_size=1, max_size=30).filter(lambda s: s not in BASE[section]))
        raw[section][name] = 1
        return dump(raw).encode(), [f"{section}.", "line", "YAML"]
    if kind == "unknown-section":
        raw[data.draw(st.text(min_size=1, max_size=30).filter(lambda s: s not in BASE))] = {"a": 1}
        return dump(raw).encode(), ["unknown section", "line", "YAML"]
    if kind == "odd-key":
        raw[section][data.draw(st.one_of(st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)))] = 1
        return dump(raw).encode(), [f"{section}.", "line"]
    if kind == "section-value":
        raw[section] = data.draw(values)
        return dump(raw).encode(), [section]
    if kind == "duplicate":
        key = data.draw(st.sampled_from(sorted(BASE[section])))
        return (dump(raw) + f"{section}:\n  {key}: 1\n").encode(), ["appears twice", "line"]
    return (dump(raw) + "? [1, 2]\n: 3\n").encode(), ["line"]


def file_mutation(data) -> tuple[bytes, list[str]]:
    text = dump(BASE).encode()
    kind = data.draw(
        st.sampled_from(["empty", "list", "scalar", "not-utf8", "bom", "nul", "huge", "documents", "cut", "bytes"]),
        label="kind",
    )
    if kind == "empty":
        return b"", []
    if kind == "list":
        return b"- 1\n- 2\n", ["mapping of sections"]
    if kind == "scalar":
        return b"just text\n", ["mapping of sections"]
    if kind == "not-utf8":
        return text + b"\xff\xfe\n", ["UTF-8"]
    if kind == "bom":
        return b"\xef\xbb\xbf" + text, []
    if kind == "nul":
        return text[:40] + b"\x00" + text[40:], ["YAML"]
    if kind == "huge":
        return text + b"# " + b"x" * (2 << 20) + b"\n", ["bytes"]
    if kind == "documents":
        return text + b"---\n" + text, ["YAML"]
    if kind == "cut":
        return text[: data.draw(st.integers(0, len(text)))], []
    return data.draw(st.binary(max_size=200)), []


MUTATIONS = {"value": value_mutation, "raw-value": raw_value_mutation, "key": key_mutation, "file": file_mutation}


def check(outcome: Outcome, path: Path, names: list[str]) -> None:
    """Accepted, or refused in one line naming the file and, where the mutation has one, one of `names`."""
    if outcome.code == 0:
        assert "Traceback" not in outcome.err
        assert_within_memory(outcome)
        return
    assert_refused_in_one_line(outcome, names=[path])
    line = outcome.err.splitlines()[0]
    assert not names or any(name in line for name in names), f"none of {names} in: {line}"


@pytest.mark.usefixtures("memory_limit")
@examples(150)
@given(data=st.data())
def test_a_mutated_config_is_accepted_or_refused_in_one_line(tmp_path_factory, data):
    mutation = data.draw(st.sampled_from(sorted(MUTATIONS)), label="mutation")
    content, names = MUTATIONS[mutation](data)
    path = tmp_path_factory.mktemp("case") / "hostile.yaml"
    path.write_bytes(content)
    check(run_tmt(["inspect", path], suite=SUITE), path, names)
