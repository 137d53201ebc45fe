"""Positions (``model.positions``): the sinusoid table of section 3.5, or learned position embeddings
(Table 3 row (E)), and the model's look-up into either. The first token of a sequence (the source's
first piece, the decoder's BOS) is position 0, as in MarianMT.

``model.position_layout`` orders a sinusoid vector: ``interleaved`` (section 3.5: sin at even dimensions,
cos at odd) or ``halves`` (the sines of every frequency, then the cosines, as MarianMT's
``MarianSinusoidalPositionalEmbedding`` writes it; the same frequencies 10000^(-2i/d) in both); ``fairseq`` is
fairseq's ``SinusoidalPositionalEmbedding`` (tensor2tensor's), which M2M100 and NLLB use: the halves order with
the frequencies 10000^(-i / (h - 1)), h = floor(d/2), and a zero last dimension when d is odd.
``model.position_offset`` numbers a sequence's first token: 0 for tmt and MarianMT; 2 for fairseq's models, whose
positions count from pad + 1 (pad = 1); the table's row i holds position i + offset.

Sinusoids are a function of the config: the table is a non-persistent buffer (never checkpointed),
recomputed when a model is built and grown, once, by :meth:`PositionTable.reserve_positions` before a
long input is encoded or decoded. Learned positions are a parameter (``pos_embed.weight``) of fixed size
``model.max_positions``: longer inputs are refused and outputs capped (:meth:`PositionTable.max_output_length`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_mt.config import ModelConfig


def sinusoids(
    length: int,
    d_model: int,
    *,
    layout: str = "interleaved",
    offset: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same); returns (length, d_model) float32,
    row r for position pos = r + ``offset``.

    ``layout="halves"``: PE(pos, i) = sin(pos / 10000^(2i/d)) for i < ceil(d/2), then PE(pos, ceil(d/2) + i) =
    cos(same) for i < floor(d/2) (MarianMT's table). ``layout="fairseq"``: with h = floor(d/2), PE(pos, i) =
    sin(pos * 10000^(-i/(h-1))) and PE(pos, h + i) = cos(same) for i < h, then 0 when d is odd (fairseq's
    ``SinusoidalPositionalEmbedding.get_embedding``, M2M100's)."""
    if layout not in ("interleaved", "halves", "fairseq"):
        raise ValueError(f"layout={layout!r} is not one of interleaved, halves, fairseq (model.position_layout)")
    # float64 for the angles: pos * 10000^(-2i/d) in float32 is off by ~1e-4 rad at pos ~ 1000.
    pos = torch.arange(offset, offset + length, dtype=torch.float64, device=device)[:, None]  # (length, 1)
    if layout == "fairseq":
        half = d_model // 2
        step = math.log(10000.0) / max(half - 1, 1)  # fairseq divides by half - 1 (a d_model of 2 would divide by 0)
        angles = pos * torch.exp(-step * torch.arange(half, dtype=torch.float64, device=device))  # (length, h)
        zero = torch.zeros(length, d_model - 2 * half, dtype=torch.float64, device=device)  # (length, d mod 2)
        return torch.cat([angles.sin(), angles.cos(), zero], dim=1).float()  # (length, d_model)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)  # (ceil(d/2),)
    angles = pos * inv_freq  # (length, ceil(d/2))
    sin, cos = angles.sin(), angles.cos()[:, : d_model // 2]  # odd d_model has one sine more than cosines
    if layout == "halves":
        return torch.cat([sin, cos], dim=1).float()  # (length, ceil(d/2) + floor(d/2))
    pe = torch.empty(length, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = sin
    pe[:, 1::2] = cos
    return pe.float()


class PositionTable(nn.Module):
    """The position vectors of :class:`~transformer_mt.model.transformer.Transformer`, mixed into it (not a
    submodule) so that the learned table keeps its checkpoint name ``pos_embed.weight``.

    Attributes set by :meth:`_init_positions`: ``learned_positions``; then ``pos_embed`` (max_positions, D)
    for learned positions, else the buffer ``pe`` (length, D) float32.
    """

    cfg: ModelConfig
    learned_positions: bool
    pos_embed: nn.Embedding
    pe: Tensor

    def _init_positions(self, cfg: ModelConfig) -> None:
        self.learned_positions = cfg.positions == "learned"
        if self.learned_positions:  # Table 3 row (E)
            self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:  # not persistent: a function of the config, recomputed (and grown) rather than checkpointed
            self.register_buffer(
                "pe",
                sinusoids(cfg.max_positions, cfg.d_model, layout=cfg.position_layout, offset=cfg.position_offset),
                persistent=False,
            )

    def _positions(self, start: int, n: int) -> Tensor:
        """Position vectors for positions [start, start + n): (n, D)."""
        end = start + n
        if self.learned_positions:
            if end > self.cfg.max_positions:
                raise ValueError(
                    f"sequence needs {end} positions but model.max_positions={self.cfg.max_positions} "
                    "(learned positions); shorten the input (data.max_len, decode max length) "
                    "or train with a larger model.max_positions"
                )
            return self.pos_embed.weight[start:end]
        if end > self.pe.size(0):  # never grown here: decoding must not change the module (threads share it)
            raise ValueError(
                f"sequence needs {end} positions but the sinusoid table holds {self.pe.size(0)}; call "
                f"model.reserve_positions({end}) before encoding or decoding "
                "(Translator and translate_ids do it for you)"
            )
        return self.pe[start:end]

    def reserve_positions(self, n: int) -> None:
        """Make positions [0, n) available before encoding or decoding: sinusoids extend to lengths unseen in
        training (section 3.5), so the table grows here, once, rather than during a search (which must not
        change the module: one model may serve several threads). Learned positions have a fixed table:
        nothing to do (longer sources are refused, outputs capped by :meth:`max_output_length`)."""
        if self.learned_positions or n <= self.pe.size(0):
            return
        # A normal tensor even when called under inference_mode, so that training can use the table later.
        # Training itself never needs more (config keeps data.max_len + 2 <= max_positions): DDP ranks see one size.
        with torch.inference_mode(False):
            cfg = self.cfg
            table = sinusoids(
                n, cfg.d_model, layout=cfg.position_layout, offset=cfg.position_offset, device=self.pe.device
            )
            self.pe = table.to(self.pe.dtype)

    def max_output_length(self) -> int | None:
        """Longest output the decoder can produce: BOS plus the first L-1 outputs occupy positions
        0..L-1 of a learned position table; None for sinusoids, which extend to any length."""
        return self.cfg.max_positions if self.learned_positions else None
