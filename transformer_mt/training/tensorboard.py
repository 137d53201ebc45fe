"""TensorBoard scalars for a training run (``train.tensorboard: true``): the records of metrics.jsonl.

The run log hands every record it writes to :meth:`TensorBoardLog.record`; each numeric field
becomes the scalar ``<kind>/<field>`` at step ``update`` (``train/loss``, ``valid/bleu``,
``summary/mfu``), so TensorBoard shows exactly the numbers of metrics.jsonl and ``tmt plot``.
The ``tensorboard`` package is optional: it is imported only when a writer is created, and without
it the error names the install command.
"""

from __future__ import annotations

import math
import os
from typing import Any

from transformer_mt.errors import TmtError

INSTALL = 'pip install -e ".[tensorboard]"'
_NOT_SCALARS = ("kind", "update", "epoch")  # the step and the record's identity, not values to plot


class TensorBoardError(TmtError, RuntimeError):
    """TensorBoard logging was asked for but cannot run."""


class TensorBoardLog:
    """Scalars of metrics.jsonl records, written under ``log_dir`` (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, log_dir: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TensorBoardError(
                f"train.tensorboard: true needs the tensorboard package: {INSTALL} (or set train.tensorboard: false)"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def record(self, rec: dict[str, Any]) -> None:
        """One metrics.jsonl record: ``kind`` (train / valid / summary; inferred from ``val_*`` keys when
        absent), ``update`` the step; ``val_`` prefixes are dropped under ``valid/``, and so is a ``valid/`` of a
        per-set key (valid/<name>/bleu)."""
        kind = rec.get("kind") or ("valid" if any(k.startswith("val_") for k in rec) else "train")
        step = rec.get("update")
        for key, value in rec.items():
            if (
                key in _NOT_SCALARS
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
            ):
                continue
            name = key[4:] if kind == "valid" and key.startswith("val_") else key.removeprefix(f"{kind}/")
            self.writer.add_scalar(f"{kind}/{name}", value, global_step=step)
        self.writer.flush()  # a run followed live, or killed, still shows its last record

    def close(self) -> None:
        self.writer.close()
