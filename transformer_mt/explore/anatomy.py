"""The inside of one batch: its masks, the tensor shapes through the model, and the positional encodings.

The batch is the sentence and its target (the translation or a reference), optionally with a second sentence
so that the shorter one is padded, as in training. Shapes are recorded the way `tmt inspect` records them
(``analysis.traced``: forward hooks and each attention's ``attend``, on the real modules while the batch runs
through ``encode`` and ``decode``); the masks are built by the model's own ``allowed_mask`` from the batch's
padding; the positions are the model's own table (``analysis.position_table``).

Mask convention (the model's): padding masks True = padding; attention masks True = may attend.
"""

from __future__ import annotations

import torch

from transformer_mt.analysis import describe, position_table, traced
from transformer_mt.data import collate
from transformer_mt.decoding import Translator
from transformer_mt.explore.session import single_model
from transformer_mt.model import MultiHeadAttention, allowed_mask


def anatomy_view(tr: Translator, pairs: list[tuple[list[int], list[int]]], *, positions: int | None = None) -> dict:
    """Masks, shapes and positions of the batch ``pairs`` (source ids, target ids; without BOS / EOS)."""
    model, device = single_model(tr), tr.device
    batch = collate(pairs, specials=model.specials)  # src (B, S), tgt_in (B, T)
    src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
    with traced(model) as (calls, details), torch.inference_mode():
        model.decode(tgt_in, model.encode(src))
    src_pad, tgt_pad = src.eq(model.specials.pad), tgt_in.eq(model.specials.pad)  # (B, S), (B, T) True = padding
    modules = [
        {"name": name, "type": describe(module), "shapes": calls.get(name, []), "details": details.get(name, [])}
        for name, module in model.named_modules()
        if name and (calls.get(name) or details.get(name))
    ]
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    n = positions or max(src.size(1), tgt_in.size(1))
    return {
        "batch": {"B": src.size(0), "S": src.size(1), "T": tgt_in.size(1)},
        "src_ids": src.tolist(),
        "tgt_in_ids": tgt_in.tolist(),
        "src_pieces": [[tr.src_tok.id_to_piece(i) for i in row] for row in src.tolist()],
        "tgt_in_pieces": [[tr.tgt_tok.id_to_piece(i) for i in row] for row in tgt_in.tolist()],
        "masks": {
            "src_pad": src_pad.tolist(),  # (B, S) True = padding
            "tgt_pad": tgt_pad.tolist(),  # (B, T) True = padding
            # (B, 1, 1, S) -> (B, S): the keys every query may see
            "encoder_allowed": allowed_mask(src_pad)[:, 0, 0].tolist(),
            # (B, 1, T, T) -> (B, T, T): look-ahead + padding
            "decoder_allowed": allowed_mask(tgt_pad, causal=True)[:, 0].tolist(),
            # (B, S): the source keys every decoder query may see
            "cross_allowed": allowed_mask(src_pad)[:, 0, 0].tolist(),
        },
        "heads": {
            "H": attention[0].heads,
            "Dk": attention[0].dk,
            "Dv": attention[0].dv,
            "d_model": tr.cfg.model.d_model,
        },
        "modules": modules,
        "positions": positions_view(tr, n),
    }


def positions_view(tr: Translator, n: int) -> dict:
    """The position vectors the model adds at positions 0..n-1: (n, d_model), and what they are."""
    m = tr.cfg.model
    table = position_table(tr.model, n)  # (n, D) float32
    return {
        "kind": m.positions,
        "layout": m.position_layout if m.positions == "sinusoidal" else None,
        "n": n,
        "d_model": table.size(1),
        "table": [[round(v, 5) for v in row] for row in table.tolist()],
    }
