"""A model rebuilt from stored weights, every size checked before anything is allocated.

A checkpoint is a file that anyone may have written: its config asks for a model, its tensors claim shapes,
and neither is trusted until they agree and fit in memory. :func:`check_fit` runs, in order:

1. the bound on the model's size (``config.size_problem``, :data:`~transformer_mt.config.MAX_PARAMETERS`
   numbers, 8 GiB in float32), counted with the tokenizers' real vocabularies, not ``tokenizer.vocab_size``;
2. the model built on the ``meta`` device: every tensor's shape and dtype, no storage;
3. every stored tensor compared with it by name, shape and dtype kind; the first missing, unexpected or
   different one is refused in one line that names the file, the tensor, its stored and its expected shape;
4. the model's stored numbers against the file's size (a checkpoint cannot hold more numbers than its bytes:
   tensors sharing one storage could otherwise ask for many times the file), and the tables the model computes
   instead of storing (the sinusoids) against :data:`MAX_POSITION_TABLE_BYTES`.

:func:`rebuild_model` then materialises the model and copies the weights in. What loading a checkpoint may
allocate is thus bounded by the file's size plus 1 GiB of position table, and never more than
``MAX_PARAMETERS`` numbers. Every loader goes through here: `tmt translate` and everything built on the
Translator (evaluate, serve, explore, inspect), and a training run's ``--init-from`` and ``--resume``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from transformer_mt.checkpoint import CheckpointError
from transformer_mt.config import (
    MAX_POSITION_TABLE_BYTES,
    ConfigError,
    ModelConfig,
    model_elements,
    quote_name,
    size_problem,
)
from transformer_mt.model import Transformer

_KEPT_IDS = "output_ids"  # model.restrict_output's kept pieces: (K,) ascending ids, K known only from the checkpoint


def _shape(t: Tensor | torch.Size) -> str:
    return str(tuple(t.shape if isinstance(t, Tensor) else t))


def _unfit(source: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{source}: the weights do not fit its config ({what}); the checkpoint was damaged or edited, "
        "use one written by `tmt train`"
    )


def skeleton(cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int, source: str) -> Transformer:
    """The model of ``cfg`` on the meta device (shapes and dtypes, no storage), once its size is within the bound."""
    problem = size_problem(model_elements(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size))
    if problem:
        raise CheckpointError(
            f"{source}: model.* with its tokenizers' {src_vocab_size:,} and {tgt_vocab_size:,} pieces make {problem}"
        )
    try:
        with torch.device("meta"):
            return Transformer(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
    except ConfigError as exc:  # the special ids or the shared embeddings do not fit the tokenizers
        raise CheckpointError(f"{source}: {exc}") from None


def check_fit(
    cfg: ModelConfig,
    weights: Mapping[str, Tensor],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    source: str,
    file_bytes: int | None,
) -> None:
    """Refuse, in one line naming ``source`` and the first tensor at fault, weights that are not exactly the
    tensors of ``cfg``'s model (see the module docstring); ``file_bytes``: the size of the file they were read
    from (None: not from a file). Reads no tensor's data but the kept ids of ``model.restrict_output``."""
    meta = skeleton(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, source=source)
    expected = meta.state_dict()  # tied parameters appear under each of their names
    missing = [name for name in expected if name not in weights]
    if missing:
        more = f", and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _unfit(source, f"tensor {missing[0]} of shape {_shape(expected[missing[0]])} is missing{more}")
    unexpected = [name for name in weights if name not in expected]
    if unexpected:
        more = f", and {len(unexpected) - 1} more" if len(unexpected) > 1 else ""
        raise _unfit(
            source,
            f"tensor {quote_name(unexpected[0])} of shape {_shape(weights[unexpected[0]])} "
            f"is not part of the model{more}",
        )
    for name, want in expected.items():
        got = weights[name]
        if name == _KEPT_IDS:
            _check_kept_ids(got, tgt_vocab_size, source)
        elif got.shape != want.shape:
            raise _unfit(source, f"tensor {name} is stored with shape {_shape(got)}, the config makes {_shape(want)}")
        elif got.is_floating_point() != want.is_floating_point() or (
            not want.is_floating_point() and got.dtype != want.dtype
        ):
            raise _unfit(source, f"tensor {name} is stored as {got.dtype}, the model holds {want.dtype}")
    # Each stored number once: tied parameters are one tensor (named_parameters() yields each once).
    unique = [name for name, _ in meta.named_parameters()] + [
        name for name, _ in meta.named_buffers() if name in expected
    ]
    stored = sum(weights[name].numel() * weights[name].element_size() for name in unique)
    if file_bytes is not None and stored > file_bytes:
        raise _unfit(
            source,
            f"its {len(unique)} tensors hold {stored:,} bytes of numbers, more than the file's {file_bytes:,} bytes",
        )
    computed = sum(b.numel() * b.element_size() for name, b in meta.named_buffers() if name not in expected)
    if computed > MAX_POSITION_TABLE_BYTES:
        raise CheckpointError(
            f"{source}: model.max_positions={cfg.max_positions} x model.d_model={cfg.d_model} make a position "
            f"table of {computed / 2**30:.1f} GiB, more than {MAX_POSITION_TABLE_BYTES >> 30} GiB; "
            "the checkpoint is damaged or crafted"
        )


def _check_kept_ids(ids: Tensor, vocab_size: int, source: str) -> None:
    """``output_ids``: 1 to V int64 ids, strictly ascending, each below V (restrict_output_to writes them so)."""
    if ids.dtype != torch.int64 or ids.dim() != 1 or not 1 <= ids.numel() <= vocab_size:
        raise _unfit(
            source, f"tensor {_KEPT_IDS} is {ids.dtype} {_shape(ids)}; the model keeps 1 to {vocab_size} int64 ids"
        )
    if ids[0] < 0 or ids[-1] >= vocab_size or (ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all())):
        raise _unfit(source, f"tensor {_KEPT_IDS} must hold ascending ids from 0 to {vocab_size - 1}")


def rebuild_model(
    cfg: ModelConfig,
    weights: Mapping[str, Tensor],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    source: str,
    file_bytes: int | None,
) -> Transformer:
    """The model of ``cfg`` holding ``weights``, on the CPU in float32, after :func:`check_fit`: only a model whose
    every tensor the file holds is ever allocated. It is built as a new model is (its computed tables with it)
    and the weights copied in, so tied parameters stay one tensor."""
    check_fit(
        cfg, weights, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, source=source, file_bytes=file_bytes
    )
    model = Transformer(cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size)
    model.load_state_dict(weights)
    return model
