"""tmt sweep: Table 3's rows scaled to a base, the table's columns and parameter counts against the trained
models, invalid rows reported, and a killed sweep that continues where it stopped."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli, run_config
from transformer_mt.config import load_config, save_config
from transformer_mt.sweep import (
    SweepError,
    Variation,
    columns,
    load_variations,
    select,
    table3_variations,
    variations_yaml,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=32",
    "model.heads=4",
    "model.d_ff=64",
    "model.dropout=0.0",
    "model.norm=pre",
    "model.max_positions=64",
    "data.max_len=60",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.005",
    "train.warmup_updates=10",
    "train.max_tokens=2000",
    "train.validate_every=1000",
    "train.valid_bleu_sentences=8",
    "train.log_every=10",
    "train.threads=1",
    "train.seed=7",
    "train.max_updates=500",
]
COLUMNS = [
    "row",
    "variant",
    "N",
    "d_model",
    "d_ff",
    "h",
    "d_k",
    "d_v",
    "P_drop",
    "eps_ls",
    "positions",
    "updates",
    "val PPL",
    "val BLEU",
    "params",
    "wall (min)",
    "status",
]


# ---------------------------------------------------------------- the variations
def test_default_rows_at_the_papers_base_are_table_3():
    """At the paper's base model (configs/transformer_base.yaml) the generated rows are the values of
    Table 3 (PAPER.md): heads 1/4/16/32 with d_k = d_v = d_model/h, d_k 16/32, N 2/4/8, d_model 256/1024,
    d_ff 1024/4096, dropout 0/0.2, label smoothing 0/0.2, learned positions."""
    path = REPO / "configs" / "transformer_base.yaml"
    rows = table3_variations(load_config(path, check_files=False))
    by_row: dict[str, list[dict[str, Any]]] = {}
    for v in rows:
        cfg = load_config(path, v.overrides, check_files=False)
        by_row.setdefault(v.row, []).append(columns(cfg))
    assert [c["d_model"] for c in by_row["base"]] == [512] and len(by_row["base"]) == 1
    assert [(c["h"], c["d_k"], c["d_v"]) for c in by_row["A"]] == [
        (1, 512, 512),
        (4, 128, 128),
        (16, 32, 32),
        (32, 16, 16),
    ]
    assert [(c["h"], c["d_k"], c["d_v"]) for c in by_row["B"]] == [(8, 16, 64), (8, 32, 64)]
    changed = [{k: v for k, v in c.items() if v != by_row["base"][0][k]} for c in by_row["C"]]
    assert changed == [
        {"N": 2, "N_dec": 2},
        {"N": 4, "N_dec": 4},
        {"N": 8, "N_dec": 8},
        {"d_model": 256, "d_k": 32, "d_v": 32},
        {"d_model": 1024, "d_k": 128, "d_v": 128},
        {"d_ff": 1024},
        {"d_ff": 4096},
    ]
    assert [(c["P_drop"], c["eps_ls"]) for c in by_row["D"]] == [(0.0, 0.1), (0.2, 0.1), (0.1, 0.0), (0.1, 0.2)]
    assert [c["positions"] for c in by_row["E"]] == ["learned"]


def test_learned_positions_row_of_a_halves_base_resets_the_layout():
    """model.position_layout orders sinusoids only: row E of a base with the halves layout asks for both keys."""
    path = REPO / "configs" / "transformer_base.yaml"
    (row,) = [
        v
        for v in table3_variations(load_config(path, ["model.position_layout=halves"], check_files=False))
        if v.row == "E"
    ]
    assert row.overrides == ["model.positions=learned", "model.position_layout=interleaved"]
    assert (
        load_config(path, ["model.position_layout=halves", *row.overrides], check_files=False).model.positions
        == "learned"
    )


def test_configs_table3_is_valid_on_the_recipe():
    rows = load_variations(REPO / "configs" / "sweeps" / "table3.yaml")
    assert [v.row for v in rows][:1] == ["base"] and {v.row for v in rows} == {"base", "A", "B", "C", "D", "E"}
    for v in rows:  # every row passes the config checks on the recipe's base
        load_config(REPO / "configs" / "multi30k_en_de.yaml", v.overrides, check_files=False)
    assert load_variations(REPO / "configs" / "sweeps" / "table3.yaml") == rows and variations_yaml(rows).count(
        "\n"
    ) == len(rows)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {row: A, set: [model.heads=1]}\n- {row: A, name: A1}\n", "two rows are named 'A1'"),
        ("- {name: x}\n", "item 1: expected a mapping with 'row'"),
        ("- {row: A, name: x, sets: []}\n", "unknown key(s) sets"),
        ("- {row: A, name: x, set: {model.heads: 1}}\n", "'set' must be a list"),
        ("- {row: A, name: cache}\n", "cannot name a run directory"),
        ("- {row: A, name: ../x}\n", "cannot name a run directory"),
        ("- {row: A, name: x, set: [train.out_dir=elsewhere]}\n", "train.out_dir is set by the sweep"),
        ("{row: A}\n", "expected a non-empty YAML list"),
        ("- [\n", "not valid YAML"),
    ],
)
def test_bad_variations_files_name_the_file_and_the_fix(tmp_path, text, message):
    path = tmp_path / "v.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SweepError, match="v.yaml") as err:
        load_variations(path)
    assert message in str(err.value)


def test_rows_select_labels_and_names():
    rows = [Variation("base", "base"), Variation("A", "A-h1"), Variation("A", "A-h8"), Variation("E", "E-learned")]
    assert select(rows, "a,BASE") == {"base", "A-h1", "A-h8"} and select(rows, "e-learned") == {"E-learned"}
    with pytest.raises(SweepError, match="no row labelled or named 'z'; choose among base, A, E, A-h1"):
        select(rows, "A,Z")


# ---------------------------------------------------------------- the sweep itself
@pytest.fixture()
def base_yaml(corpus_slice, spm_model, tmp_path) -> Path:
    path = tmp_path / "base.yaml"
    save_config(run_config(corpus_slice, spm_model, tmp_path / "unused", *TINY), path)
    return path


def rebuilt_parameters(checkpoint: Path) -> tuple[int, int]:
    """(sum(p.numel()) of the model rebuilt from the checkpoint, the same counted from the saved tensors alone:
    one per storage, since a tied matrix is saved once under two names)."""
    from transformer_mt.checkpoint import config_from_checkpoint, load_checkpoint, unpack_tokenizers
    from transformer_mt.model import Transformer
    from transformer_mt.text import Tokenizer

    state = load_checkpoint(checkpoint)
    vocab = [Tokenizer(p).vocab_size for p in unpack_tokenizers(state)]
    model = Transformer(config_from_checkpoint(state).model, src_vocab_size=vocab[0], tgt_vocab_size=vocab[1])
    model.load_state_dict(state["model"])
    storages = {t.untyped_storage().data_ptr(): t.numel() for t in state["model"].values()}
    return sum(p.numel() for p in model.parameters()), sum(storages.values())


@pytest.mark.slow
def test_sweep_writes_the_table_with_parameters_of_the_trained_models(base_yaml, tmp_path, capsys):
    variations = tmp_path / "rows.yaml"
    variations.write_text(
        "- {row: base, name: base}\n- {row: A, name: A-h1, set: [model.heads=1]}\n"
        "- {row: A, name: A-h3, set: [model.heads=3]}\n- {row: E, name: E-learned, set: [model.positions=learned]}\n"
    )
    out = tmp_path / "sweep"
    code, stdout, stderr = run_cli(
        ["sweep", "--config", base_yaml, "--variations", variations, "--budget-updates", 20, "-o", out], capsys
    )
    assert code == 0, stderr
    table = json.loads((out / "table3.json").read_text())
    rows = {r["name"]: r for r in table["rows"]}
    assert [r["name"] for r in table["rows"]] == ["base", "A-h1", "A-h3", "E-learned"]
    assert table["budget"]["updates"] == 20 and table["bleu"]["beam"] == 1 and table["bleu"]["sentences"] == 8

    invalid = rows["A-h3"]
    assert (
        invalid["status"] == "invalid"
        and "not divisible by model.heads=3" in invalid["note"]
        and not (out / "A-h3").exists()
    )
    counts = {}
    for name in ("base", "A-h1", "E-learned"):
        r = rows[name]
        assert r["status"] == "done" and r["updates"] == 20 and r["stop_reason"] == "max_updates=20 reached"
        rebuilt, from_tensors = rebuilt_parameters(out / name / "checkpoint_last.pt")
        assert r["params"] == rebuilt == from_tensors
        counts[name] = r["params"]
        last_valid = [
            json.loads(line)
            for line in (out / name / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "valid"
        ][-1]
        assert (
            last_valid["update"] == 20
            and r["val_ppl"] == last_valid["val_ppl"]
            and r["val_bleu"] == last_valid["val_bleu"]
        )
        assert math.isfinite(r["val_ppl"]) and r["val_ppl"] > 1 and 0 <= r["val_bleu"] <= 100 and r["wall_s"] > 0
    # first principles: with d_k = d_v = d_model/h the projections keep their size (row A of the paper has the
    # base's parameters); learned positions add a max_positions x d_model table
    assert counts["A-h1"] == counts["base"] and counts["E-learned"] - counts["base"] == 64 * 32
    assert (rows["A-h1"]["h"], rows["A-h1"]["d_k"], rows["A-h1"]["d_v"]) == (1, 32, 32)

    md = (out / "table3.md").read_text().splitlines()
    header = next(i for i, line in enumerate(md) if line.startswith("| row |"))
    assert [c.strip() for c in md[header].strip("|").split("|")] == COLUMNS
    body = [[c.strip() for c in line.strip("|").split("|")] for line in md[header + 2 :]]
    assert [b[1] for b in body] == ["base", "A-h1", "A-h3", "E-learned"] and all(len(b) == len(COLUMNS) for b in body)
    assert (
        body[1][COLUMNS.index("h")] == "1" and body[1][COLUMNS.index("d_model")] == ""
    )  # only what differs from the base
    assert body[1][COLUMNS.index("params")] == f"{counts['A-h1']:,}" and body[2][-1].startswith("invalid: ")
    assert body[3][COLUMNS.index("positions")] == "learned" and "greedy" in "\n".join(md[:header])
    assert md[header] in stdout
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    picture = imread(out / "table3.png")
    assert picture.ndim == 3 and picture.shape[0] > 100 and picture.std() > 0


@pytest.mark.slow
def test_killed_sweep_continues_where_it_stopped(base_yaml, tmp_path, capsys, monkeypatch):
    import transformer_mt.training as train_module

    out = tmp_path / "sweep"
    variations = tmp_path / "rows.yaml"
    variations.write_text("- {row: base, name: base}\n- {row: E, name: E-learned, set: [model.positions=learned]}\n")
    argv = ["sweep", "--config", base_yaml, "--variations", variations, "--budget-updates", 20, "-o", out]
    assert run_cli([*argv, "--rows", "base"], capsys)[0] == 0
    first = json.loads((out / "table3.json").read_text())["rows"]
    assert [r["status"] for r in first] == ["done", "not run"] and not (out / "E-learned").exists()
    stamp = (out / "base" / "checkpoint_last.pt").stat().st_mtime_ns

    # the E row is stopped by a signal at update 8, as Ctrl-C or a scheduler's SIGTERM would
    real_train = train_module.train

    def interrupt_at_update_8(update: int, _stats: object) -> None:
        if update == 8:
            os.kill(os.getpid(), signal.SIGINT)

    def interrupted_train(cfg, **kwargs):
        return real_train(cfg, on_update=interrupt_at_update_8, **kwargs)

    monkeypatch.setattr(train_module, "train", interrupted_train)
    code, _, stderr = run_cli(argv, capsys)
    assert code == 130 and "run the same command again to continue" in stderr
    rows = json.loads((out / "table3.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["done", "interrupted"] and "saved at update 8" in rows[1]["note"]

    monkeypatch.setattr(train_module, "train", real_train)
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    rows = json.loads((out / "table3.json").read_text())["rows"]
    assert [(r["status"], r["updates"]) for r in rows] == [("done", 20), ("done", 20)]
    assert (
        out / "base" / "checkpoint_last.pt"
    ).stat().st_mtime_ns == stamp  # the finished row was read back, not retrained
    summaries = [
        json.loads(line)
        for line in (out / "E-learned" / "metrics.jsonl").read_text().splitlines()
        if '"summary"' in line
    ]
    assert [(s["update"], s["stop_reason"]) for s in summaries] == [(8, "interrupted"), (20, "max_updates=20 reached")]
    assert re.search(
        r"resumed from \S+ at update 8,", (out / "E-learned" / "train.log").read_text()
    )  # resumed, not restarted
    assert rows[1]["params"] == rebuilt_parameters(out / "E-learned" / "checkpoint_last.pt")[0]

    # the same directory with another budget is refused before anything trains
    code, _, stderr = run_cli([*argv[:-4], "--budget-updates", 30, "-o", out], capsys)
    assert code == 2 and "trained with another config (train.max_updates was 20, now 30)" in stderr
    assert (out / "base" / "checkpoint_last.pt").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_rows_share_one_tokenizer_unless_they_change_it(corpus_slice, spm_model, tmp_path, capsys):
    """A base without tokenizer.model: the sweep trains one sentencepiece model for every row that keeps the
    base's tokenizer settings (the same pieces in each checkpoint); a row that changes them trains its own."""
    from transformer_mt.checkpoint import load_checkpoint, unpack_tokenizers
    from transformer_mt.text import Tokenizer

    base = tmp_path / "base.yaml"
    save_config(
        run_config(corpus_slice, spm_model, tmp_path / "unused", *TINY, "tokenizer.model=", "tokenizer.vocab_size=300"),
        base,
    )
    rows = tmp_path / "rows.yaml"
    rows.write_text(
        "- {row: base, name: base}\n"
        "- {row: A, name: A-h2, set: [model.heads=2]}\n"
        "- {row: X, name: X-v200, set: [tokenizer.vocab_size=200]}\n"
    )
    out = tmp_path / "sweep"
    code, _, stderr = run_cli(["sweep", "-c", base, "--variations", rows, "--budget-updates", 3, "-o", out], capsys)
    assert code == 0, stderr
    packed = {
        name: unpack_tokenizers(load_checkpoint(out / name / "checkpoint_last.pt"))[0]
        for name in ("base", "A-h2", "X-v200")
    }
    assert packed["base"] == packed["A-h2"] == (out / "tokenizer" / "spm.model").read_bytes()
    assert Tokenizer(packed["base"]).vocab_size == 300 and Tokenizer(packed["X-v200"]).vocab_size == 200
    assert (out / "X-v200" / "spm.model").is_file() and not (out / "base" / "spm.model").exists()
    assert [r["status"] for r in json.loads((out / "table3.json").read_text())["rows"]] == ["done"] * 3


def test_sweep_writes_its_table_only_when_a_row_has_finished(base_yaml, tmp_path, capsys, monkeypatch):
    import transformer_mt.training as train_module

    out = tmp_path / "sweep"
    out.mkdir()
    names = ("table3.json", "table3.md", "table3.png")
    for name in names:  # an earlier table (or anything by these names) stays until a row has something new to say
        (out / name).write_bytes(b"earlier " + name.encode())
    variations = tmp_path / "rows.yaml"
    variations.write_text("- {row: base, name: base}\n")
    seen = []

    def failing_train(cfg, **kwargs):
        seen.append({name: (out / name).read_bytes() for name in names})
        raise train_module.TrainError("diverged")

    monkeypatch.setattr(train_module, "train", failing_train)
    argv = ["sweep", "--config", base_yaml, "--variations", variations, "--budget-updates", 2, "-o", out]
    code, _, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    assert seen == [{name: b"earlier " + name.encode() for name in names}]  # untouched while the row trained
    assert [r["status"] for r in json.loads((out / "table3.json").read_text())["rows"]] == ["failed"]
    stamps = {name: (out / name).stat()[1:9:7] for name in names[:2]}  # (inode, mtime)
    assert run_cli(argv, capsys)[0] == 0 and len(seen) == 1  # nothing to train, nothing new: the table is not rewritten
    assert {name: (out / name).stat()[1:9:7] for name in names[:2]} == stamps
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp") or ".tmp." in p.name]
