"""MarianMT's tensor names and tmt's, both ways, and reading MarianMT's weight files.

Per layer (``model.encoder.layers.{i}.`` -> ``encoder.{i}.``, ``model.decoder.layers.{i}.`` -> ``decoder.{i}.``):

- ``self_attn`` / ``encoder_attn``: ``q_proj``, ``k_proj``, ``v_proj`` are the row blocks [W^Q; W^K; W^V] of
  tmt's fused ``in_weight`` / ``in_bias`` (``self_attn`` / ``cross_attn``), ``out_proj`` is ``out``;
  both scale queries by head_dim^-0.5;
- ``fc1`` / ``fc2`` are ``ffn.fc1`` / ``ffn.fc2``;
- encoder ``self_attn_layer_norm`` / ``final_layer_norm`` are ``norm1`` / ``norm2``; decoder
  ``self_attn_layer_norm`` / ``encoder_attn_layer_norm`` / ``final_layer_norm`` are ``norm1`` / ``norm2`` / ``norm3``.

Embeddings: ``model.shared.weight`` (``share_encoder_decoder_embeddings``) is tmt's one matrix ``src_embed`` =
``tgt_embed`` = ``output_proj``; otherwise ``model.encoder.embed_tokens`` / ``model.decoder.embed_tokens`` are
``src_embed`` / ``tgt_embed``, and ``lm_head`` is ``output_proj.weight`` unless tied (MarianMT then ignores it, and so
does tmt). ``final_logits_bias`` (1, V) is ``output_proj.bias`` (V,). ``embed_positions`` are not weights in
either (a function of the config); when a file holds them they must be MarianMT's sinusoids.

Export of a model whose sinusoids are ``interleaved`` (the paper's order): MarianMT's table is the same vectors
with the dimensions reordered (all sines, then all cosines), so the whole residual stream is permuted by that
order: embedding columns, the input columns of every linear that reads it (attention projections, fc1, the
output layer), the output rows and biases of every linear that writes it (attention ``out``, fc2), and each
LayerNorm's weight and bias (LayerNorm commutes with a permutation). The exported model computes the same
function exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from transformer_mt.config import ModelConfig, quote, quote_name
from transformer_mt.hf.errors import HfError, brief, require_safetensors
from transformer_mt.hf.vocab import MAX_CONFIG_BYTES, read_json
from transformer_mt.model import Transformer, sinusoids

SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
ENCODER = {"self_attn_layer_norm": "norm1", "fc1": "ffn.fc1", "fc2": "ffn.fc2", "final_layer_norm": "norm2"}
DECODER = {
    "self_attn_layer_norm": "norm1",
    "encoder_attn_layer_norm": "norm2",
    "fc1": "ffn.fc1",
    "fc2": "ffn.fc2",
    "final_layer_norm": "norm3",
}
ATTENTION = {"encoder": {"self_attn": "self_attn"}, "decoder": {"self_attn": "self_attn", "encoder_attn": "cross_attn"}}
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# MarianMT writes its one shared matrix under the first name; older files repeat it under the others.
SHARED = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the dtypes imported (as float32)
FLOAT_TORCH_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Stored:
    """One tensor of a weight file as its header describes it (nothing of its numbers read): the file that holds
    it, its shape and dtype, and how to read it."""

    file: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name (F32, BF16, ...) or torch's (torch.float32, ...)
    floating: bool
    read: Callable[[], Tensor]


class Layout(NamedTuple):
    """The MarianMT tensors a tmt model built from the imported config needs, with their shapes."""

    parts: dict[str, tuple[str, ...]]  # tmt name -> the MarianMT tensors it is made of (rows stacked in this order)
    shapes: dict[str, tuple[tuple[int, ...], ...]]  # MarianMT name -> the shapes it may be stored with
    required: frozenset[str]  # the names a file must hold (the others in shapes are optional)


def open_weights(directory: Path) -> tuple[dict[str, Stored], str]:
    """The tensors of a MarianMT directory as their headers describe them, and the file that lists them:
    model.safetensors, else its shards (``model.safetensors.index.json``), else pytorch_model.bin loaded weights-only
    (no code in a pickle runs) and memory-mapped. Shapes and dtypes are known before any tensor's numbers are read."""
    if (directory / SAFETENSORS).is_file():
        return _safetensors_header(directory / SAFETENSORS), str(directory / SAFETENSORS)
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        return _shards(directory, index), str(index)
    if (directory / PYTORCH_BIN).is_file():
        return _pytorch_bin(directory / PYTORCH_BIN), str(directory / PYTORCH_BIN)
    raise HfError(
        f"{directory}: holds no {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}; give a directory written by "
        "save_pretrained"
    )


def _safetensors_header(path: Path) -> dict[str, Stored]:
    st = require_safetensors()
    with path.open("rb") as handle:  # the format: an 8-byte little-endian header length, the JSON header, the numbers
        length = int.from_bytes(handle.read(8), "little")
    if length > MAX_CONFIG_BYTES:
        raise HfError(
            f"{path}: its header claims {length:,} bytes, more than the {MAX_CONFIG_BYTES:,} a model's tensor list "
            "needs; download it again"
        )
    try:
        handle = st.safe_open(
            str(path), framework="pt"
        )  # parses the header, checks the offsets against the file's size
        slices = {name: handle.get_slice(name) for name in handle.keys()}
        return {
            name: Stored(
                str(path),
                tuple(part.get_shape()),
                part.get_dtype(),
                part.get_dtype() in FLOAT_DTYPES,
                partial(handle.get_tensor, name),
            )
            for name, part in slices.items()
        }
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        raise HfError(f"{path}: not a readable safetensors file ({brief(exc)}); download it again") from None


def _shards(directory: Path, index: Path) -> dict[str, Stored]:
    """The tensors of the shards an index lists: each shard a file of ``directory``, each tensor in the shard the
    index names for it, and in no other."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise HfError(
            f"{index}: weight_map={quote(weight_map)} must be a non-empty object of tensor names and shard files; "
            "re-save the model with save_pretrained"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise HfError(
                f"{index}: weight_map gives tensor {quote_name(name)} the shard {quote(shard)}, not a file name; "
                "re-save the model"
            )
    weights: dict[str, Stored] = {}
    for shard in sorted(set(weight_map.values())):
        for name, tensor in _safetensors_header(_shard_path(directory, shard, index)).items():
            if weight_map.get(name) != shard:
                where = "in no shard" if name not in weight_map else f"in {quote(weight_map[name])}"
                raise HfError(
                    f"{index}: shard {quote(shard)} holds tensor {quote_name(name)}, which weight_map puts {where}; "
                    "re-save the model"
                )
            weights[name] = tensor
    absent = sorted(set(weight_map) - set(weights))
    if absent:
        raise HfError(
            f"{index}: tensor {quote_name(absent[0])} is not in its shard {quote(weight_map[absent[0]])} "
            f"({len(absent)} such); download every shard again"
        )
    return weights


def _shard_path(directory: Path, shard: str, index: Path) -> Path:
    """A shard's file: a plain name of a regular file in ``directory``. An absolute path, a name with a directory
    part or ``..``, and a link that leads out of ``directory`` are refused (the index is a file from a stranger;
    following its names could import any file of the machine)."""
    if shard in ("", ".", "..") or Path(shard).name != shard or "\\" in shard or "\0" in shard:
        raise HfError(
            f"{index}: weight_map names the shard {quote(shard)}; a shard must be a file name in the model's "
            "directory, without a path"
        )
    path = directory / shard
    try:
        real, root = path.resolve(strict=True), directory.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop of links
        raise HfError(
            f"{index}: weight_map names the shard {quote(shard)}, which is not in the model's directory; download "
            "every shard"
        ) from None
    if real.parent != root:
        raise HfError(
            f"{index}: weight_map names the shard {quote(shard)}, a link to a file outside the model's directory; copy "
            "the shard itself into it"
        )
    if not real.is_file():
        raise HfError(
            f"{index}: weight_map names the shard {quote(shard)}, which is not a regular file; download every shard"
        )
    return real


def _pytorch_bin(path: Path) -> dict[str, Stored]:
    try:  # weights-only: no code in the pickle runs; mmap: the tensors' numbers stay in the file until read
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001
        # torch raises many types for a bad or unsafe pickle; all are one user error
        raise HfError(
            f"{path}: cannot be loaded weights-only ({brief(exc)}); re-save it as model.safetensors"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise HfError(f"{path}: not a state dict of named tensors; re-save the model with save_pretrained")
    return {
        name: Stored(str(path), tuple(t.shape), str(t.dtype), t.dtype in FLOAT_TORCH_DTYPES, partial(_same, t))
        for name, t in state.items()
    }


def _same(t: Tensor) -> Tensor:
    return t


def map_layers(
    cfg: ModelConfig,
    expected: dict[str, tuple[int, ...]],
    parts: dict[str, tuple[str, ...]],
    shapes: dict[str, tuple[tuple[int, ...], ...]],
) -> None:
    """Add every encoder and decoder layer's tensors to ``parts`` (tmt name -> the Hugging Face names it is made of)
    and ``shapes`` (Hugging Face name -> its allowed shapes): the BART family's layer names, which MarianMT and
    M2M100 / NLLB share; ``expected``: tmt's state dict shapes."""
    for stack, count, plain in (("encoder", cfg.encoder_layers, ENCODER), ("decoder", cfg.decoder_layers, DECODER)):
        for i in range(count):
            hf, ours = f"model.{stack}.layers.{i}.", f"{stack}.{i}."
            names = {
                f"{ours}{mine}.out.{kind}": f"{hf}{theirs}.out_proj.{kind}"
                for theirs, mine in ATTENTION[stack].items()
                for kind in ("weight", "bias")
            }
            names |= {
                f"{ours}{mine}.{kind}": f"{hf}{theirs}.{kind}"
                for theirs, mine in plain.items()
                for kind in ("weight", "bias")
            }
            for theirs, mine in ATTENTION[stack].items():
                for kind in ("weight", "bias"):  # [W^Q; W^K; W^V] rows, as tmt's fused projection holds them
                    fused = expected[f"{ours}{mine}.in_{kind}"]  # (3 D, D) or (3 D,)
                    pieces = tuple(f"{hf}{theirs}.{p}_proj.{kind}" for p in "qkv")
                    parts[f"{ours}{mine}.in_{kind}"] = pieces
                    shapes.update({piece: ((fused[0] // 3, *fused[1:]),) for piece in pieces})
            for mine, theirs in names.items():
                parts[mine], shapes[theirs] = (theirs,), (expected[mine],)


def marian_layout(model: Transformer, stored: Collection[str]) -> Layout:
    """The MarianMT tensors that make ``model``'s state dict (``model`` may live on the meta device: only its
    shapes are read), by name and shape; ``stored``: the names a file holds (which of the aliases of a shared
    embedding matrix it uses)."""
    cfg, expected = model.cfg, {name: tuple(t.shape) for name, t in model.state_dict().items()}
    parts: dict[str, tuple[str, ...]] = {}
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {}
    optional: set[str] = set()

    def one(ours: str, theirs: str) -> None:
        parts[ours], shapes[theirs] = (theirs,), (expected[ours],)

    if cfg.share_all_embeddings:
        name = next((n for n in SHARED if n in stored), SHARED[0])
        for ours in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight"):
            one(ours, name)
        aliases = [n for n in (*SHARED, "lm_head.weight") if n != name]  # copies of the one matrix: checked, not read
    else:
        one("src_embed.weight", "model.encoder.embed_tokens.weight")
        one("tgt_embed.weight", "model.decoder.embed_tokens.weight")
        one(
            "output_proj.weight",
            "model.decoder.embed_tokens.weight" if cfg.share_decoder_embeddings else "lm_head.weight",
        )
        aliases = ["lm_head.weight"] if cfg.share_decoder_embeddings else []
    for alias in aliases:
        shapes[alias] = (expected["output_proj.weight"],)
        optional.add(alias)
    vocab = expected["output_proj.bias"][0]
    shapes["final_logits_bias"] = (
        (1, vocab),
        (vocab,),
    )  # MarianMT's (1, V); tmt's (V,) is filled with zeros without it
    optional.add("final_logits_bias")
    for name in POSITIONS:  # MarianMT's sinusoids: compared with tmt's, not imported
        shapes[name] = ((cfg.max_positions, cfg.d_model),)
        optional.add(name)
    map_layers(cfg, expected, parts, shapes)
    if set(expected) - set(parts) != {"output_proj.bias"}:
        raise AssertionError(f"no MarianMT tensor for {sorted(set(expected) - set(parts) - {'output_proj.bias'})}")
    return Layout(parts, shapes, frozenset(shapes) - optional)


def check_stored(stored: dict[str, Stored], layout: Layout, *, source: str) -> None:
    """Refuse, in one line naming the file and the tensor, a file whose tensors are not those of ``layout`` by
    name, shape and dtype (a floating one); ``source``: the file that lists them (for a missing one). Reads no
    numbers."""
    missing = sorted(layout.required - set(stored))
    if missing:
        raise HfError(
            f"{source}: tensor {missing[0]} is missing ({len(missing)} such); the file does not match its config.json"
        )
    surplus = sorted(set(stored) - set(layout.shapes))
    if surplus:
        first = stored[surplus[0]]
        raise HfError(
            f"{first.file}: tensor {quote_name(surplus[0])} has no place in a MarianMT model of this config.json "
            f"({len(surplus)} such); tmt cannot import it"
        )
    for name in (n for n in layout.shapes if n in stored):  # the embeddings first, then layer by layer
        tensor, allowed = stored[name], layout.shapes[name]
        if tensor.shape not in allowed:
            raise HfError(
                f"{tensor.file}: tensor {name} has shape {tensor.shape}, config.json implies {allowed[0]}; the file "
                "does not match it"
            )
        if not tensor.floating:
            raise HfError(
                f"{tensor.file}: tensor {name} is stored as {tensor.dtype}; MarianMT's weights are floating point "
                "(F32, F16 or BF16)"
            )


def tmt_state(stored: dict[str, Stored], layout: Layout, model: Transformer) -> dict[str, Tensor]:
    """The state dict of ``model`` (on the meta device: only its config and shapes are used) from MarianMT tensors
    that passed :func:`check_stored`, float32; a tied matrix is one tensor under each of its names. Holds one
    layer's q, k and v while they are fused besides the state it returns, and the sinusoid table while the stored
    ones are compared with it."""
    cfg, read = model.cfg, _Reader(stored)
    out: dict[str, Tensor] = {}
    for ours, parts in layout.parts.items():
        # one part: read once and kept (tied names share it); q, k and v: read, fused, and let go
        out[ours] = read.kept(parts[0]) if len(parts) == 1 else torch.cat([read(p) for p in parts])
    bias = "final_logits_bias"
    out["output_proj.bias"] = (
        read(bias).reshape(-1) if bias in stored else torch.zeros(model.tgt_vocab_size)
    )  # (1, V) -> (V,)
    tables = [name for name in POSITIONS if name in stored]
    if tables:
        expected = sinusoids(cfg.max_positions, cfg.d_model, layout="halves")
        for name in tables:
            if not torch.allclose(read(name), expected, atol=1e-4):
                raise HfError(
                    f"{stored[name].file}: {name} is not MarianMT's sinusoid table; tmt imports models with fixed "
                    "sinusoidal positions only"
                )
    return out


class _Reader:
    """Stored tensors read as float32, each mistake in reading one line naming the file."""

    def __init__(self, stored: dict[str, Stored]):
        self.stored = stored
        self.kept_tensors: dict[str, Tensor] = {}

    def kept(self, name: str) -> Tensor:
        """``name`` read once: a second call (a tied matrix under another tmt name) returns the same tensor."""
        if name not in self.kept_tensors:
            self.kept_tensors[name] = self(name)
        return self.kept_tensors[name]

    def __call__(self, name: str) -> Tensor:
        tensor = self.stored[name]
        try:
            return tensor.read().float()
        except Exception as exc:  # noqa: BLE001 - a file damaged after its header: safetensors' or torch's error
            raise HfError(
                f"{tensor.file}: tensor {name} cannot be read ({brief(exc)}); download the file again"
            ) from None


def residual_order(model: Transformer) -> Tensor:
    """(D,) the residual-stream dimension of tmt's model at each of MarianMT's: all sines, then all cosines.
    The identity for the halves layout; for the interleaved one the even dimensions, then the odd ones."""
    d = model.cfg.d_model
    if model.cfg.position_layout == "halves":
        return torch.arange(d)
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def marian_state(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights under MarianMT's names (contiguous float32 copies), the residual stream in MarianMT's
    sinusoid order (module docstring); tied matrices once, under the name MarianMT loads them from."""
    cfg, perm = model.cfg, residual_order(model)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}

    def reads(w: Tensor) -> Tensor:  # a linear reading the residual stream: its input columns
        return w[:, perm]

    def writes(w: Tensor) -> Tensor:  # a linear writing it, or a LayerNorm on it: its output rows
        return w[perm]

    out: dict[str, Tensor] = {}
    if cfg.share_all_embeddings:
        out["model.shared.weight"] = reads(state["src_embed.weight"])
    else:
        out["model.encoder.embed_tokens.weight"] = reads(state["src_embed.weight"])
        out["model.decoder.embed_tokens.weight"] = reads(state["tgt_embed.weight"])
        if not cfg.share_decoder_embeddings:
            out["lm_head.weight"] = reads(state["output_proj.weight"])
    out["final_logits_bias"] = _output_bias(model)[None, :]  # (V,) -> (1, V)
    for stack, count, plain in (("encoder", cfg.encoder_layers, ENCODER), ("decoder", cfg.decoder_layers, DECODER)):
        for i in range(count):
            hf, ours = f"model.{stack}.layers.{i}.", f"{stack}.{i}."
            for theirs, mine in ATTENTION[stack].items():
                sizes = [cfg.d_model] * 3  # marian_refusal checked: every head is d_model / heads wide
                q, k, v = reads(state[f"{ours}{mine}.in_weight"]).split(sizes)
                qb, kb, vb = state[f"{ours}{mine}.in_bias"].split(sizes)
                for p, w, b in (("q", q, qb), ("k", k, kb), ("v", v, vb)):
                    out[f"{hf}{theirs}.{p}_proj.weight"], out[f"{hf}{theirs}.{p}_proj.bias"] = w, b
                out[f"{hf}{theirs}.out_proj.weight"] = writes(state[f"{ours}{mine}.out.weight"])
                out[f"{hf}{theirs}.out_proj.bias"] = writes(state[f"{ours}{mine}.out.bias"])
            for theirs, mine in plain.items():
                weight, bias = state[f"{ours}{mine}.weight"], state[f"{ours}{mine}.bias"]
                out[f"{hf}{theirs}.weight"] = reads(weight) if mine == "ffn.fc1" else writes(weight)
                out[f"{hf}{theirs}.bias"] = bias if mine == "ffn.fc1" else writes(bias)
    return {k: v.contiguous() for k, v in out.items()}


def _output_bias(model: Transformer) -> Tensor:
    """(V,) MarianMT's final_logits_bias: tmt's output bias (zeros without model.output_bias); with
    model.restrict_output, -1e9 on the pieces not kept, whose probability is then exactly 0 in float32, as tmt's
    -inf."""
    bias = model.output_proj.bias
    full = torch.zeros(model.tgt_vocab_size) if bias is None else bias.detach().float().cpu()
    if model.output_ids is None:
        return full
    kept = model.output_ids.cpu()
    return torch.full_like(full, -1e9).index_copy_(0, kept, full[kept])
