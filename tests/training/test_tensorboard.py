"""TensorBoardLog: metrics.jsonl records come back from the event files as the same scalars; no package, one line."""

from __future__ import annotations

import sys

import pytest

from transformer_mt.errors import TmtError


def test_records_read_back_as_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from transformer_mt.training import TensorBoardLog

    log = TensorBoardLog(tmp_path / "tb")
    log.record({"kind": "train", "update": 20, "epoch": 1, "loss": 7.5, "lr": 1e-3, "wall": 3.0})
    log.record({"update": 40, "epoch": 1, "loss": 6.25})  # an older record without kind
    log.record({"kind": "valid", "update": 40, "val_loss": 6.5, "val_bleu": 1.25, "note": "text is skipped"})
    log.record({"update": 80, "val_loss": 5.5})  # an older valid record: known by its val_ keys
    log.record({"kind": "summary", "update": 80, "mfu": 0.25, "peak_source": "config", "resumed": False})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars == {
        "train/loss": [(20, 7.5), (40, 6.25)],
        "train/lr": [(20, pytest.approx(1e-3))],
        "train/wall": [(20, 3.0)],
        "valid/loss": [(40, 6.5), (80, 5.5)],
        "valid/bleu": [(40, 1.25)],
        "summary/mfu": [(80, 0.25)],
    }


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    from transformer_mt.training import TensorBoardLog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import` now raises ImportError
    with pytest.raises(TmtError) as err:
        TensorBoardLog(tmp_path / "tb")
    message = str(err.value)
    assert 'pip install -e ".[tensorboard]"' in message and "\n" not in message
    assert not (tmp_path / "tb").exists()
