"""`tmt average -o` replaces only an earlier average (or any file with --force), never a directory, never
a run's numbered checkpoint name, and writes atomically."""

from __future__ import annotations

import shutil

from tests.conftest import make_checkpoint, run_cli
from transformer_mt.checkpoint import load_checkpoint


def _inputs(spm_model, tmp_path):
    return [make_checkpoint(spm_model, tmp_path / f"in{i}.pt", seed=i) for i in range(2)]


def test_average_refuses_to_replace_a_file_it_did_not_write(spm_model, tmp_path, capsys):
    a, b = _inputs(spm_model, tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"not a checkpoint\n")
    best = tmp_path / "best.pt"  # a checkpoint outside any run: --force may replace it
    best.write_bytes(a.read_bytes())
    for target in (notes, best):
        code, _, err = run_cli(["average", str(a), str(b), "-o", str(target)], capsys)
        assert code == 2 and err.count("\n") == 1 and str(target) in err and "--force" in err
    assert notes.read_bytes() == b"not a checkpoint\n" and best.read_bytes() == a.read_bytes()
    code, _, err = run_cli(["average", str(a), str(b), "-o", str(best), "--force"], capsys)
    assert code == 0 and load_checkpoint(best)["averaged_from"] == [str(a), str(b)]
    avg = tmp_path / "avg.pt"
    assert run_cli(["average", str(a), str(b), "-o", str(avg)], capsys)[0] == 0
    assert run_cli(["average", str(b), str(a), "-o", str(avg)], capsys)[0] == 0  # an earlier average is replaced
    assert load_checkpoint(avg)["averaged_from"] == [str(b), str(a)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries left


def test_average_refuses_a_directory_and_a_numbered_name_in_a_run(spm_model, tmp_path, capsys):
    a, b = _inputs(spm_model, tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    code, _, err = run_cli(["average", str(a), str(b), "-o", str(folder), "--force"], capsys)
    assert code == 2 and err.count("\n") == 1 and str(folder) in err and list(folder.iterdir()) == []
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(a.read_bytes())
    numbered = run / "checkpoint_9.pt"
    code, _, err = run_cli(["average", str(a), str(b), "-o", str(numbered), "--force"], capsys)
    assert code == 2 and err.count("\n") == 1 and "checkpoint_9.pt" in err and "--resume" in err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_last.pt"]


def test_average_never_replaces_a_checkpoint_of_the_run_even_with_force(spm_model, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for seed, update in enumerate((100, 200, 300)):
        make_checkpoint(spm_model, run / f"checkpoint_{update}.pt", seed=seed)
    shutil.copy(run / "checkpoint_200.pt", run / "checkpoint_best.pt")
    shutil.copy(run / "checkpoint_300.pt", run / "checkpoint_last.pt")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for name in ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint_300.pt"):
        for force in ([], ["--force"]):
            code, out, err = run_cli(["average", "--run", run, "--last", 2, "-o", run / name, *force], capsys)
            assert code == 2 and out == "" and err.count("\n") == 1, (name, force, err)
            assert err.startswith(f"tmt: error: {run / name}:") and "give another" in err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # the run's checkpoints are all still there
    # an average that the user put under the best name is an average, and an average may replace it
    assert run_cli(["average", "--run", run, "--last", 2, "-o", tmp_path / "avg.pt"], capsys)[0] == 0
    shutil.copy(tmp_path / "avg.pt", run / "checkpoint_best.pt")
    assert run_cli(["average", "--run", run, "--last", 3, "-o", run / "checkpoint_best.pt"], capsys)[0] == 0
    assert len(load_checkpoint(run / "checkpoint_best.pt")["averaged_from"]) == 3
