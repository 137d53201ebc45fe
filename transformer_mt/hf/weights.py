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

import json
from pathlib import Path

import torch
from torch import Tensor

from transformer_mt.hf import HfError, require_safetensors
from transformer_mt.model import Transformer, sinusoids

SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
ENCODER = {"self_attn_layer_norm": "norm1", "fc1": "ffn.fc1", "fc2": "ffn.fc2", "final_layer_norm": "norm2"}
DECODER = {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2", "fc1": "ffn.fc1", "fc2": "ffn.fc2", "final_layer_norm": "norm3"}
ATTENTION = {"encoder": {"self_attn": "self_attn"}, "decoder": {"self_attn": "self_attn", "encoder_attn": "cross_attn"}}
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# MarianMT writes its one shared matrix under the first name; older files repeat it under the others.
SHARED = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def read_weights(directory: Path) -> tuple[dict[str, Tensor], str]:
    """The tensors of a MarianMT directory and the file they came from: model.safetensors (or its shards),
    else pytorch_model.bin loaded weights-only (no code in a pickle runs)."""
    if (directory / SAFETENSORS).is_file():
        return _read_safetensors(directory / SAFETENSORS), str(directory / SAFETENSORS)
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise HfError(f"{index}: not a safetensors index (a JSON object with a weight_map); re-save the model with save_pretrained") from None
        weights: dict[str, Tensor] = {}
        for shard in shards:
            weights.update(_read_safetensors(directory / shard))
        return weights, str(index)
    if (directory / PYTORCH_BIN).is_file():
        path = directory / PYTORCH_BIN
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad or unsafe pickle; all are one user error
            raise HfError(f"{path}: cannot be loaded weights-only ({str(exc).splitlines()[0][:200]}); re-save it as model.safetensors") from None
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise HfError(f"{path}: not a state dict of tensors; re-save the model with save_pretrained")
        return dict(state), str(path)
    raise HfError(f"{directory}: holds no {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}; give a directory written by save_pretrained")


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    st = require_safetensors()
    if not path.is_file():
        raise HfError(f"{path}: weight file not found (named in {SAFETENSORS_INDEX}); download every shard")
    try:
        return dict(st.load_file(str(path)))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        raise HfError(f"{path}: not a readable safetensors file ({str(exc).splitlines()[0][:200]}); download it again") from None


def tmt_state(weights: dict[str, Tensor], model: Transformer, *, source: str) -> dict[str, Tensor]:
    """MarianMT tensors -> the state dict of ``model`` (built from the imported config), float32, every shape
    checked; a missing or surplus tensor is refused naming it and ``source``."""
    cfg = model.cfg
    taken: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in weights:
            raise HfError(f"{source}: tensor {name} is missing; the file does not match its config.json")
        taken.add(name)
        return weights[name].float()

    out: dict[str, Tensor] = {}
    if cfg.share_all_embeddings:
        name = next((n for n in SHARED if n in weights), SHARED[0])
        out["src_embed.weight"] = out["tgt_embed.weight"] = out["output_proj.weight"] = take(name)
        taken.update(n for n in (*SHARED, "lm_head.weight") if n in weights)  # aliases of the one matrix
    else:
        out["src_embed.weight"] = take("model.encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = take("model.decoder.embed_tokens.weight")
        out["output_proj.weight"] = out["tgt_embed.weight"] if cfg.share_decoder_embeddings else take("lm_head.weight")
        taken.update(n for n in ("lm_head.weight",) if n in weights)
    bias = weights.get("final_logits_bias")
    out["output_proj.bias"] = torch.zeros(model.tgt_vocab_size) if bias is None else bias.float().reshape(-1)  # (1, V) -> (V,)
    taken.add("final_logits_bias")
    for stack, count, plain in (("encoder", cfg.encoder_layers, ENCODER), ("decoder", cfg.decoder_layers, DECODER)):
        for i in range(count):
            hf, ours = f"model.{stack}.layers.{i}.", f"{stack}.{i}."
            for theirs, mine in ATTENTION[stack].items():
                for kind in ("weight", "bias"):  # [W^Q; W^K; W^V] rows, as tmt's fused projection holds them
                    out[f"{ours}{mine}.in_{kind}"] = torch.cat([take(f"{hf}{theirs}.{p}_proj.{kind}") for p in "qkv"])
                    out[f"{ours}{mine}.out.{kind}"] = take(f"{hf}{theirs}.out_proj.{kind}")
            for theirs, mine in plain.items():
                for kind in ("weight", "bias"):
                    out[f"{ours}{mine}.{kind}"] = take(f"{hf}{theirs}.{kind}")
    _check_positions(weights, cfg.d_model, source=source)
    taken.update(POSITIONS)
    surplus = sorted(set(weights) - taken)
    if surplus:
        raise HfError(f"{source}: tensor {surplus[0]} has no place in a MarianMT model of this config.json ({len(surplus)} such); tmt cannot import it")
    _check_shapes(out, model, source=source)
    return out


def _check_positions(weights: dict[str, Tensor], d_model: int, *, source: str) -> None:
    for name in POSITIONS:
        if name in weights:
            table = weights[name].float()
            if table.dim() != 2 or not torch.allclose(table, sinusoids(table.size(0), d_model, layout="halves"), atol=1e-4):
                raise HfError(f"{source}: {name} is not MarianMT's sinusoid table; tmt imports models with fixed sinusoidal positions only")


def _check_shapes(state: dict[str, Tensor], model: Transformer, *, source: str) -> None:
    expected = model.state_dict()
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise HfError(f"{source}: {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}; the file does not match it")


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
    model.restrict_output, -1e9 on the pieces not kept, whose probability is then exactly 0 in float32, as tmt's -inf."""
    bias = model.output_proj.bias
    full = torch.zeros(model.tgt_vocab_size) if bias is None else bias.detach().float().cpu()
    if model.output_ids is None:
        return full
    kept = model.output_ids.cpu()
    return torch.full_like(full, -1e9).index_copy_(0, kept, full[kept])
