"""The weights to decode with: a checkpoint's trained weights or their moving average (``train.ema_decay``), each
entry checked to be a named tensor the file holds whole before any is cast or copied."""

from __future__ import annotations

from typing import Any

import torch

from transformer_mt.checkpoint.io import CheckpointError
from transformer_mt.config import quote_name

WEIGHTS = (
    "ema",
    "raw",
)  # which weights of a checkpoint to decode: the moving average (train.ema_decay) or the trained ones


def stored_whole(tensor: torch.Tensor) -> bool:
    """Whether the file holds every number of ``tensor``: a dense tensor whose numbers fit in its storage. A view
    with a stride of 0 or overlapping strides could make a (10^6, 10^6) tensor of one float, which any copy or cast
    would then allocate in full."""
    if tensor.layout != torch.strided:
        return False
    return tensor.numel() * tensor.element_size() <= tensor.untyped_storage().nbytes()


def named_tensors(entry: Any, what: str, source: str) -> dict[str, torch.Tensor]:
    """``entry`` checked to be {name: tensor}, every tensor held whole by the file (:func:`stored_whole`)."""
    if not isinstance(entry, dict):
        raise CheckpointError(
            f"{source}: its {what} is not a mapping of names to tensors; the checkpoint is damaged, use another one"
        )
    for name, tensor in entry.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise CheckpointError(
                f"{source}: its {what} entry {quote_name(name)} is not a named tensor; the checkpoint is damaged, use "
                "another one"
            )
        if not stored_whole(tensor):
            raise CheckpointError(
                f"{source}: its {what} tensor {quote_name(name)} of shape {tuple(tensor.shape)} claims more numbers "
                "than the file stores for it; the checkpoint is damaged or crafted, use another one"
            )
    return entry


def model_weights(
    state: dict[str, Any], *, weights: str | None = None, source: str = "checkpoint"
) -> dict[str, torch.Tensor]:
    """The model ``state_dict`` to decode with: `weights` "ema" (the moving average, what validation chose the best
    checkpoint on), "raw" (the trained weights), or None: "ema" when the checkpoint holds them, else "raw".
    Every entry is checked to be a named tensor held whole by the file, and each EMA weight to have its
    parameter's name and shape, before any is cast; whether they fit the model is its loader's check."""
    if weights not in (None, *WEIGHTS):
        raise CheckpointError(f"--weights {weights}: choose one of {', '.join(WEIGHTS)}")
    ema = state.get("ema")
    has_ema = ema is not None and not (isinstance(ema, dict) and not ema)
    if weights == "ema" and not has_ema:
        raise CheckpointError(
            f"{source}: --weights ema, but the checkpoint holds no EMA weights (train.ema_decay was 0); use --weights "
            "raw"
        )
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(
            f"{source}: checkpoint holds no 'model' weights; give a checkpoint written by `tmt train` or `tmt average`"
        )
    raw = named_tensors(state["model"], "'model'", source)
    if weights == "raw" or not has_ema:
        return raw
    if not isinstance(ema, dict) or "weights" not in ema:
        raise CheckpointError(
            f"{source}: its 'ema' entry holds no 'weights'; the checkpoint is damaged, decode its trained weights with "
            "--weights raw"
        )
    model = dict(raw)
    for name, tensor in named_tensors(
        ema["weights"], "'ema' weights", source
    ).items():  # parameters only: buffers stay the model's
        if name not in model:
            raise CheckpointError(
                f"{source}: EMA weight {quote_name(name)} is not a model parameter; the checkpoint is damaged, use "
                "--weights raw"
            )
        param = model[name]
        if tensor.shape != param.shape or not tensor.is_floating_point():
            raise CheckpointError(
                f"{source}: EMA weight {quote_name(name)} is {tensor.dtype} {tuple(tensor.shape)}, its parameter "
                f"{param.dtype} {tuple(param.shape)}; the checkpoint is damaged, use --weights raw"
            )
        model[name] = tensor.to(model[name].dtype)
    return model
