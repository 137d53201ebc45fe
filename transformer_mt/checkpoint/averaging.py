"""Averaging checkpoints into one inference checkpoint (`tmt average`): the element-wise mean of their weights,
of the EMA weights or the raw ones, refused across architectures or tokenizers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint.entries import unpack_tokenizers, unpack_vocabularies
from transformer_mt.checkpoint.io import CheckpointError, load_checkpoint
from transformer_mt.checkpoint.retention import is_numbered_checkpoint
from transformer_mt.checkpoint.weights import WEIGHTS, model_weights

# The training-state keys an averaged (inference) checkpoint does not carry.
TRAINING_KEYS = ("optimizer", "scheduler", "scaler", "rng", "progress", "metrics", "ema")
RUN_CHECKPOINTS = ("checkpoint_last.pt", "checkpoint_best.pt")  # what training writes besides checkpoint_<update>.pt


def average_checkpoints(paths: Sequence[str | os.PathLike], *, weights: str | None = None) -> dict[str, Any]:
    """An inference checkpoint whose weights are the element-wise mean of those in ``paths``.

    Floating-point tensors are summed in float64 and cast back to their dtype; integer and
    bool buffers (counters, masks) are taken from the last checkpoint, as are ``config`` and
    ``tokenizers``. Optimizer, scheduler, RNG and progress are dropped. Checkpoints of
    different architectures (model config or parameter names and shapes) are refused. `weights`: which
    weights of each checkpoint (:func:`model_weights`): "ema", "raw", or None: the EMA weights when every
    checkpoint holds them, else the raw ones (both are summed until a checkpoint without EMA shows up).
    """
    files = [Path(p) for p in paths]
    if not files:
        raise CheckpointError("no checkpoints to average; give at least one path")
    kinds: dict[str, dict[str, torch.Tensor]] = {
        kind: {} for kind in ([weights] if weights else WEIGHTS)
    }  # kind -> float64 sums
    first_path, first = files[0], None
    first_tokenizers: tuple = ()
    last: dict[str, Any] = {}
    for path in files:
        last = load_checkpoint(path)
        if not isinstance(last.get("model"), dict):
            raise CheckpointError(f"{path}: checkpoint has no 'model' weights; give checkpoints written by `tmt train`")
        if any("lora" in name.split(".") for name in last["model"]):  # the mean of B A is not mean(B) mean(A)
            raise CheckpointError(
                f"{path}: holds LoRA adapters, which do not average; merge each checkpoint first (tmt merge -c ...) "
                "and average the merged ones"
            )
        tokenizers = (unpack_tokenizers(last, source=str(path)), unpack_vocabularies(last, source=str(path)))
        if first is None:
            first = {
                "config": last.get("config"),
                "model": {k: (tuple(v.shape), v.dtype) for k, v in last["model"].items()},
            }
            first_tokenizers = tokenizers
        else:
            _check_same_architecture(first_path, first, path, last)
            if (
                tokenizers != first_tokenizers
            ):  # equal vocabulary sizes are not enough: the ids must mean the same pieces
                what = "sentencepiece models" if tokenizers[0] != first_tokenizers[0] else "vocabularies"
                raise CheckpointError(
                    f"cannot average {first_path} and {path}: their {what} differ; "
                    "average checkpoints of one run (or of runs trained with the same tokenizer.model)"
                )
        if weights is None and not last.get("ema"):
            kinds.pop("ema", None)
        for kind, sums in kinds.items():
            for name, tensor in model_weights(last, weights=kind, source=str(path)).items():
                if tensor.is_floating_point():
                    acc = tensor.to(torch.float64)
                    sums[name] = acc if name not in sums else sums[name].add_(acc)
    chosen, sums = next(iter(kinds.items()))  # WEIGHTS puts "ema" first
    model = {}
    for name, tensor in last["model"].items():
        model[name] = (sums[name] / len(files)).to(tensor.dtype) if name in sums else tensor
    out = {k: v for k, v in last.items() if k not in TRAINING_KEYS}
    out.update(model=model, averaged_from=[str(p) for p in files], averaged_weights=chosen)
    return out


def check_average_output(
    output: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, force: bool = False
) -> None:
    """Refuse an output the average must not replace: one of its inputs, a directory, a numbered checkpoint
    name in a run directory (the run's resume and pruning would take the average for a training checkpoint),
    a run's checkpoint_best.pt or checkpoint_last.pt that is not an earlier average (``force`` or not: the run's
    best weights or its training state would be lost), or an existing file that is not an earlier average, unless
    ``force``."""
    out = Path(output)
    if out.is_dir() or (out.exists() and not out.is_file()):
        raise CheckpointError(f"{out}: exists and is not a regular file; give a file path for the averaged checkpoint")
    if is_numbered_checkpoint(out) and _is_run_dir(out.parent):
        raise CheckpointError(
            f"{out}: a numbered checkpoint name in a run directory, which `tmt train --resume` would take for a "
            "training checkpoint; give another name (e.g. average.pt)"
        )
    if not out.exists():
        return
    for path in inputs:  # a checkpoint replaced by the average loses its training state
        if Path(path).exists() and os.path.samefile(out, path):
            raise CheckpointError(
                f"{out}: the output is the input checkpoint {path}; writing it would destroy that checkpoint, so give "
                "another -o"
            )
    if out.name in RUN_CHECKPOINTS and _is_run_dir(out.parent) and not _is_average(out):
        raise CheckpointError(
            f"{out}: the run's own {out.name}, not an average; --force never replaces a checkpoint of the run, so give "
            "another -o (e.g. average.pt)"
        )
    if not force and not _is_average(out):
        raise CheckpointError(
            f"{out}: exists and is not an averaged checkpoint; give another -o, or pass --force to replace it"
        )


def _is_run_dir(directory: Path) -> bool:
    """Whether ``directory`` holds a training run (its config, lock or checkpoints)."""
    names = ("config.yaml", ".lock", *RUN_CHECKPOINTS)
    return directory.is_dir() and (
        any((directory / n).exists() for n in names) or any(is_numbered_checkpoint(p) for p in directory.iterdir())
    )


def _is_average(path: Path) -> bool:
    try:
        return "averaged_from" in load_checkpoint(path)
    except (CheckpointError, OSError):
        return False


def _check_same_architecture(path_a: Path, a: dict[str, Any], path_b: Path, b: dict[str, Any]) -> None:
    def refuse(what: str) -> None:
        raise CheckpointError(
            f"cannot average {path_a} and {path_b}: {what}; average checkpoints of one run (or of identically "
            "configured runs)"
        )

    model_a = (a.get("config") or {}).get("model", {})
    model_b = (b.get("config") or {}).get("model", {})
    for key in sorted(model_a.keys() | model_b.keys()):
        if model_a.get(key) != model_b.get(key):
            refuse(f"model.{key} differs ({model_a.get(key)!r} vs {model_b.get(key)!r})")
    shapes_a = a["model"]
    shapes_b = {k: (tuple(v.shape), v.dtype) for k, v in b["model"].items()}
    for name in shapes_a:
        if name not in shapes_b:
            refuse(f"parameter {name!r} is missing from the second")
        if shapes_a[name] != shapes_b[name]:
            refuse(f"parameter {name!r} differs ({_describe(shapes_a[name])} vs {_describe(shapes_b[name])})")
    for name in shapes_b:
        if name not in shapes_a:
            refuse(f"parameter {name!r} is missing from the first")


def _describe(shape_dtype: tuple[tuple[int, ...], torch.dtype]) -> str:
    shape, dtype = shape_dtype
    return f"shape {list(shape)} {str(dtype).removeprefix('torch.')}"
