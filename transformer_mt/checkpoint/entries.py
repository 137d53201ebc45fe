"""What a loaded checkpoint holds besides its weights, read back and checked: the tokenizers (sentencepiece protos
stored as uint8 tensors, and the vocabularies of an imported tokenizer) and the experiment config.

Every entry is checked before it is used, so a damaged or crafted checkpoint is a CheckpointError naming the file
and the entry, never a traceback; the weights are :mod:`~transformer_mt.checkpoint.weights`'.
"""

from __future__ import annotations

from typing import Any

import torch

from transformer_mt.checkpoint.io import CheckpointError
from transformer_mt.checkpoint.weights import stored_whole
from transformer_mt.config import Config, ConfigError, from_dict
from transformer_mt.text import SpecialIds, Tokenizer, TokenizerError


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    """``bytes`` -> 1-D uint8 tensor (a copy), storable under weights_only in every torch version."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """Inverse of :func:`bytes_to_tensor`."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        got = (
            f"{tensor.dtype} with shape {tuple(tensor.shape)}"
            if isinstance(tensor, torch.Tensor)
            else f"a {type(tensor).__name__}"
        )
        raise CheckpointError(f"expected a 1-D uint8 tensor of bytes, got {got}")
    return tensor.cpu().numpy().tobytes()


def pack_tokenizers(
    src_proto: bytes,
    tgt_proto: bytes | None = None,
    *,
    src_vocab: list[str] | None = None,
    tgt_vocab: list[str] | None = None,
) -> dict[str, Any]:
    """The ``tokenizers`` entry: sentencepiece protos as tensors (joint vocabulary: tgt = src), and the vocabularies
    of a tokenizer whose ids come from a vocabulary file (:class:`~transformer_mt.text.Tokenizer` with ``vocab``)."""
    entry: dict[str, Any] = {
        "src": bytes_to_tensor(src_proto),
        "tgt": bytes_to_tensor(src_proto if tgt_proto is None else tgt_proto),
    }
    for side, vocab in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if vocab is not None:
            entry[side] = list(vocab)
    return entry


def pack_tokenizer_pair(src: Tokenizer, tgt: Tokenizer) -> dict[str, Any]:
    """:func:`pack_tokenizers` of two tokenizers: what a checkpoint stores of them."""
    return pack_tokenizers(src.proto, tgt.proto, src_vocab=src.vocab, tgt_vocab=tgt.vocab)


def unpack_tokenizers(state: dict[str, Any], *, source: str = "checkpoint") -> tuple[bytes, bytes]:
    """(src_proto, tgt_proto) from a loaded checkpoint; feed them to ``Tokenizer(proto)``."""
    toks = state.get("tokenizers")
    if not isinstance(toks, dict) or not {"src", "tgt"} <= toks.keys():
        raise CheckpointError(
            f"{source}: checkpoint holds no sentencepiece models ('tokenizers' with 'src' and 'tgt'); give a "
            "checkpoint written by `tmt train`"
        )
    for side in ("src", "tgt"):
        proto = toks[side]
        if (
            not isinstance(proto, torch.Tensor)
            or proto.dtype != torch.uint8
            or proto.dim() != 1
            or not stored_whole(proto)
        ):
            raise CheckpointError(
                f"{source}: its tokenizers' {side!r} is not a sentencepiece model (1-D uint8 tensor); the checkpoint "
                "is damaged, use another one"
            )
    return tensor_to_bytes(toks["src"]), tensor_to_bytes(toks["tgt"])


def unpack_vocabularies(
    state: dict[str, Any], *, source: str = "checkpoint"
) -> tuple[list[str] | None, list[str] | None]:
    """(src_vocab, tgt_vocab) of a loaded checkpoint: the piece of each id for a tokenizer whose ids come from a
    vocabulary file, None for a side whose ids are sentencepiece's own."""
    toks = state.get("tokenizers")
    toks = toks if isinstance(toks, dict) else {}
    vocabs = []
    for side in ("src_vocab", "tgt_vocab"):
        vocab = toks.get(side)
        if vocab is not None and not (isinstance(vocab, list) and all(isinstance(p, str) for p in vocab)):
            raise CheckpointError(
                f"{source}: its tokenizers' {side!r} is not a list of pieces; the checkpoint is damaged, use another "
                "one"
            )
        vocabs.append(vocab)
    return vocabs[0], vocabs[1]


def tokenizers_from_checkpoint(
    state: dict[str, Any], cfg: Config, *, source: str = "checkpoint"
) -> tuple[Tokenizer, Tokenizer]:
    """The (source, target) tokenizers a loaded checkpoint holds, with the special ids of its ``cfg.model``.
    A joint vocabulary gives one Tokenizer twice. A model that does not parse, or whose ids do not fit the
    config, is a CheckpointError naming the checkpoint."""
    protos, vocabs = unpack_tokenizers(state, source=source), unpack_vocabularies(state, source=source)
    specials = SpecialIds.of(cfg.model)
    made: list[Tokenizer] = []
    for side, proto, vocab in zip(("src", "tgt"), protos, vocabs):
        if made and proto == made[0].proto and vocab == made[0].vocab:
            made.append(made[0])
            continue
        try:
            made.append(Tokenizer(proto, vocab=vocab, specials=specials))
        except RuntimeError:  # sentencepiece: "INTERNAL: ... ParseFromArray ..."
            raise CheckpointError(
                f"{source}: its sentencepiece model {side!r} is corrupt (it does not parse); use another checkpoint of "
                "the run"
            ) from None
        except TokenizerError as exc:
            raise CheckpointError(f"{source}: {side} tokenizer: {exc}") from None
    return made[0], made[1]


def config_from_checkpoint(state: dict[str, Any], *, source: str = "checkpoint") -> Config:
    """The experiment Config stored in a loaded checkpoint (checked like a YAML file)."""
    if not isinstance(state.get("config"), dict):
        raise CheckpointError(f"{source}: checkpoint holds no 'config'; give a checkpoint written by `tmt train`")
    try:
        return from_dict(state["config"], source=source)
    except ConfigError as exc:
        raise CheckpointError(f"{exc}; the checkpoint may come from another transformer_mt version") from None
