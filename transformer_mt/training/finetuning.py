"""What a run trains of its model: every weight (the default), the adapters of ``train.lora``, or what ``train.freeze``
leaves; what that costs in memory; and the adapter file written beside each checkpoint of a LoRA run.

Freezing sets ``requires_grad`` False, so the optimizer (optim.build_optimizer takes the parameters that train)
holds no state for a frozen weight and autograd computes no gradient for it. ``train.freeze`` names whole parts:
``embeddings`` (the embedding tables, learned positions and the output projection, one tensor when tied),
``encoder`` / ``decoder`` (their layers and final norm), and the first N layers of a stack
(``encoder_layers``, ``decoder_layers``, counted from the embeddings).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from transformer_mt.checkpoint import (
    CheckpointError,
    config_from_checkpoint,
    load_checkpoint,
    model_weights,
    save_checkpoint,
)
from transformer_mt.config import FreezeConfig, LoraConfig, TrainConfig
from transformer_mt.model import Transformer, adapter_weights, add_lora, merge_lora_weights

ADAPTER_FORMAT = "transformer_mt-adapter/1"
ADAPTER_SUFFIX = ".adapter.pt"  # checkpoint_best.pt -> checkpoint_best.adapter.pt


def prepare_for_training(model: Transformer, t: TrainConfig) -> Transformer:
    """The run's model with what trains set: adapters added (train.lora, every base weight frozen) or parts frozen
    (train.freeze). Call before the optimizer is built."""
    if t.lora.rank > 0:
        add_lora(model, t.lora)
    else:
        freeze_parts(model, t.freeze)
    return model


def freeze_parts(model: Transformer, freeze: FreezeConfig) -> None:
    """``requires_grad`` False on the parts ``freeze`` names (module docstring)."""
    parts: list[nn.Module | nn.Parameter | None] = []
    if freeze.embeddings:
        parts += [model.src_embed, model.tgt_embed, model.output_proj, getattr(model, "pos_embed", None)]
    encoder = len(model.encoder) if freeze.encoder else freeze.encoder_layers
    decoder = len(model.decoder) if freeze.decoder else freeze.decoder_layers
    parts += list(model.encoder[:encoder]) + list(model.decoder[:decoder])
    if freeze.encoder:
        parts.append(model.encoder_norm)
    if freeze.decoder:
        parts.append(model.decoder_norm)
    for part in parts:
        if isinstance(part, nn.Module):
            part.requires_grad_(False)


@dataclass(frozen=True)
class TrainedShare:
    """How many of a model's numbers train, and the bytes of weights, gradients and Adam's two moments."""

    trained: int  # numbers in parameters that train (a tied matrix once)
    frozen: int  # numbers in parameters that do not
    trained_bytes: int  # their weights' bytes
    frozen_bytes: int

    @classmethod
    def of(cls, model: nn.Module) -> TrainedShare:
        trained = [p for p in model.parameters() if p.requires_grad]
        frozen = [p for p in model.parameters() if not p.requires_grad]
        return cls(
            trained=sum(p.numel() for p in trained),
            frozen=sum(p.numel() for p in frozen),
            trained_bytes=sum(p.numel() * p.element_size() for p in trained),
            frozen_bytes=sum(p.numel() * p.element_size() for p in frozen),
        )

    @property
    def share(self) -> float:
        return self.trained / max(1, self.trained + self.frozen)

    @property
    def training_bytes(self) -> int:
        """Weights, gradients and Adam's exp_avg and exp_avg_sq of the trained parameters (each in the weight's
        dtype, as torch keeps them), plus the frozen weights alone: what the optimisation holds besides activations."""
        return 4 * self.trained_bytes + self.frozen_bytes

    def describe(self) -> str:
        """One line for the log: what trains, and the memory of weights, gradients and Adam states."""
        return (
            f"training {self.trained:,} of {self.trained + self.frozen:,} parameters ({100 * self.share:.2f}%); "
            f"memory: trained {_gib(self.trained_bytes)} weights + {_gib(self.trained_bytes)} gradients + "
            f"{_gib(2 * self.trained_bytes)} Adam states, frozen {_gib(self.frozen_bytes)} weights "
            f"(total {_gib(self.training_bytes)} before activations)"
        )

    def as_record(self) -> dict[str, Any]:
        """Its numbers for the end-of-run summary record."""
        return {
            "trained_parameters": self.trained,
            "frozen_parameters": self.frozen,
            "trained_share": self.share,
            "training_state_bytes": self.training_bytes,
        }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def adapter_path(checkpoint: Path) -> Path:
    """The adapter file beside a checkpoint: checkpoint_best.pt -> checkpoint_best.adapter.pt."""
    return checkpoint.with_name(checkpoint.name.removesuffix(".pt") + ADAPTER_SUFFIX)


def adapter_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """A LoRA run's checkpoint reduced to its adapters and their config (plain types, weights-only loadable); None
    for a checkpoint without adapters."""
    weights = adapter_weights(state["model"])
    if not weights:
        return None
    config = state["config"]
    return {
        "format": ADAPTER_FORMAT,
        "adapters": weights,
        "lora": dict(config["train"]["lora"]),
        "model": dict(config["model"]),
    }


def config_without_lora(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's config dict with train.lora off: the config of its merged weights."""
    out = {section: dict(values) for section, values in config.items()}
    out["train"]["lora"] = asdict(LoraConfig())
    return out


def merge_checkpoint(path: Path, output: Path | None = None, *, force: bool = False) -> Path:
    """``tmt merge``: the checkpoint at ``path`` with its adapters folded into the base weights (W + alpha / r B A),
    written as an ordinary checkpoint (weights, config with train.lora off, tokenizers) to ``output`` (default:
    beside it, ``<name>.merged.pt``). The weights merged are those decoding takes: the EMA weights when the run kept
    them, else the trained ones. Returns the path written."""
    output = output or path.with_name(path.name.removesuffix(".pt") + ".merged.pt")
    if output.exists() and not force:
        raise CheckpointError(f"{output}: exists; give another --output or add --force to replace it")
    state = load_checkpoint(path, map_location="cpu")
    cfg = config_from_checkpoint(state, source=str(path))
    weights = model_weights(state, source=str(path))
    if not adapter_weights(weights):
        raise CheckpointError(
            f"{path}: holds no LoRA adapters (train.lora.rank was 0); it is an ordinary checkpoint already"
        )
    merged = merge_lora_weights(weights, cfg.model, cfg.train.lora)
    out = {
        "model": merged,
        "config": config_without_lora(state["config"]),
        "tokenizers": state["tokenizers"],
        "merged_from": str(path),
    }
    return save_checkpoint(out, output)
