"""The random generators of a training run as a checkpoint's ``rng`` entry (plain types), so that a
resumed run draws the same dropout masks as an uninterrupted one."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every generator a training run draws from, as plain types (resume == uninterrupted run).

    Python's ``random.getstate()`` is (version, tuple of 625 ints, gauss_next); numpy's legacy
    state holds a uint32 array, stored here as an int64 tensor (torch lacks full uint32 support).
    """
    version, internal, gauss_next = random.getstate()
    out: dict[str, Any] = {"python": [version, list(internal), gauss_next], "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state(legacy=True))  # legacy=True: the tuple form
    out["numpy"] = [str(kind), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`. Generators missing there (CUDA) or here are skipped: resuming a GPU
    run on CPU is allowed and only changes the random stream of the missing device."""
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if state.get("cuda") and torch.cuda.is_available():
        saved = state["cuda"]
        for device in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[device].cpu(), device)
