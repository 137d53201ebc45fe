"""Attention maps of one sentence: encoder self, decoder self (causal) and cross-attention, every layer and head.

The weights come from :meth:`Transformer.attention`: the model's own layers and masks with the weights requested,
teacher-forcing either the model's translation (the search's hypothesis ids, so the maps are those of the output
``tmt translate`` prints) or a given reference. Conventions, as in the JSON file:

* ``weights[layer][head][query][key]``, layers and heads 0-based like the module names (``encoder.0``);
* source positions: the source pieces + ``</s>``; decoder positions: the input ``<s> y1 .. yn`` as keys of the
  decoder self-attention, and each query row labelled by the piece that position *predicts* (``y1 .. yn </s>``),
  so cross-attention rows read as "to produce this piece, the model looked at...";
* every row sums to 1; decoder self-attention is 0 above the diagonal (position t sees inputs <= t).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from transformer_mt.data import collate
from transformer_mt.errors import TmtError


class AnalysisError(TmtError, ValueError):
    """A sentence or a selection the analysis cannot take (empty, an ensemble, out of range); one line with the fix."""


@dataclass
class AttentionMaps:
    """One sentence pair's attention weights, trimmed to its own length (no padding)."""

    source: str
    target: str
    teacher_forced: bool  # True: the target was given (--ref); False: it is the model's translation
    src_pieces: list[str]  # S = source pieces + "</s>"
    tgt_in_pieces: list[str]  # T = "<s>" + target pieces
    tgt_out_pieces: list[str]  # T = target pieces + "</s>"
    encoder_self: torch.Tensor  # (L_enc, H, S, S)
    decoder_self: torch.Tensor  # (L_dec, H, T, T)
    cross: torch.Tensor  # (L_dec, H, T, S)
    encoder_layers: list[int] | None = None  # which encoder layers the tensors hold (None: all, 0..L_enc-1)
    decoder_layers: list[int] | None = None  # which decoder layers (None: all)
    heads: list[int] | None = None  # which heads (None: all)

    def layer_ids(self, kind: str) -> list[int]:
        w, picked = getattr(self, kind), self.encoder_layers if kind == "encoder_self" else self.decoder_layers
        return list(range(w.size(0))) if picked is None else picked

    def labels(self, which: str) -> list[str]:
        return {"src": self.src_pieces, "tgt_in": self.tgt_in_pieces, "tgt_out": self.tgt_out_pieces}[which]

    def select(self, layers: list[int] | None, heads: list[int] | None) -> AttentionMaps:
        """Keep these layers (of each stack that has them) and heads; AnalysisError naming a number out of range."""
        n_enc, n_dec, n_heads = self.encoder_self.size(0), self.cross.size(0), self.cross.size(1)
        for name, picked, n in (("--layers", layers, max(n_enc, n_dec)), ("--heads", heads, n_heads)):
            bad = [i for i in picked or [] if not 0 <= i < n]
            if bad:
                raise AnalysisError(
                    f"{name} {','.join(map(str, bad))}: the model has {n} {name[2:]}, numbered 0 to {n - 1}"
                )
        enc = None if layers is None else [i for i in layers if i < n_enc]
        dec = None if layers is None else [i for i in layers if i < n_dec]
        return dataclasses.replace(
            self,
            encoder_self=_pick(self.encoder_self, enc, heads),
            decoder_self=_pick(self.decoder_self, dec, heads),
            cross=_pick(self.cross, dec, heads),
            encoder_layers=enc,
            decoder_layers=dec,
            heads=heads,
        )

    def to_json(self) -> dict:
        n_heads = self.cross.size(1)
        return {
            "source": self.source,
            "target": self.target,
            "teacher_forced": self.teacher_forced,
            "src_pieces": self.src_pieces,
            "tgt_in_pieces": self.tgt_in_pieces,
            "tgt_out_pieces": self.tgt_out_pieces,
            "encoder_layers": self.layer_ids("encoder_self"),
            "decoder_layers": self.layer_ids("cross"),
            "heads": list(range(n_heads)) if self.heads is None else self.heads,
            "convention": "weights[layer][head][query][key], rows sum to 1; encoder_self (L, H, S, S) over "
            "src_pieces; decoder_self (L, H, T, T): rows predict tgt_out_pieces, keys are tgt_in_pieces, 0 above "
            "the diagonal; cross (L, H, T, S): rows predict tgt_out_pieces, keys are src_pieces",
            "encoder_self": self.encoder_self.tolist(),
            "decoder_self": self.decoder_self.tolist(),
            "cross": self.cross.tolist(),
        }


def _pick(w: torch.Tensor, layers: list[int] | None, heads: list[int] | None) -> torch.Tensor:
    """(L, H, Q, K) -> (len(layers), len(heads), Q, K); None keeps all."""
    w = w if layers is None else w[layers]
    return w if heads is None else w[:, heads]


def batch_attention(
    model, src_ids: list[list[int]], tgt_ids: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced weights of a padded batch (ids without BOS/EOS): encoder (B, L, H, S, S), decoder
    (B, L, H, T, T), cross (B, L, H, T, S), and the batch's src (B, S) and tgt_in (B, T)."""
    batch = collate(list(zip(src_ids, tgt_ids)), specials=model.specials)
    device = next(model.parameters()).device
    model.reserve_positions(max(batch.src.size(1), batch.tgt_in.size(1)))
    was_training = model.training
    model.eval()  # no dropout: the weights decoding uses
    try:
        with torch.inference_mode():
            w = model.attention(batch.src.to(device), batch.tgt_in.to(device))
    finally:
        model.train(was_training)
    # L x (B, H, Q, K) -> (B, L, H, Q, K)
    stack = lambda ws: torch.stack([t.float().cpu() for t in ws], dim=1)  # noqa: E731
    return stack(w.encoder), stack(w.decoder), stack(w.cross), batch.src, batch.tgt_in


def sentence_maps(
    translator, source: str, *, reference: str | None = None, beam: int | None = None, lenpen: float | None = None
) -> AttentionMaps:
    """The maps of ``source`` translated by ``translator``'s model (or teacher-forcing ``reference``)."""
    from transformer_mt.decoding import translate_ids

    if not source.strip():
        raise AnalysisError('the source sentence is empty; give one with --src "text" or FILE --line N')
    if not hasattr(translator.model, "attention"):
        raise AnalysisError("attention maps are drawn for one model, not an ensemble; give one checkpoint (-c)")
    src_tok, tgt_tok, d = translator.src_tok, translator.tgt_tok, translator.cfg.decode
    beam, lenpen = translator.decode_defaults(beam, lenpen)
    src_ids = src_tok.encode([source])[0][: translator.max_src_tokens]
    if reference is not None:
        tgt_ids = tgt_tok.encode([reference])[0]
    else:  # the search's own output ids: the maps of exactly what `tmt translate` prints
        hyp = translate_ids(
            translator.model,
            [src_ids],
            beam=beam,
            lenpen=lenpen,
            max_len_a=d.max_len_a,
            max_len_b=d.max_len_b,
            device=translator.device,
            dtype="float32",
        )
        tgt_ids = hyp[0][0].tokens
    enc, dec, cross, _, _ = batch_attention(translator.model, [src_ids], [tgt_ids])
    piece = lambda tok, ids: [tok.id_to_piece(i) for i in ids]  # noqa: E731
    return AttentionMaps(
        source=source,
        target=reference if reference is not None else tgt_tok.decode([tgt_ids])[0],
        teacher_forced=reference is not None,
        src_pieces=piece(src_tok, src_ids) + ["</s>"],
        tgt_in_pieces=["<s>"] + piece(tgt_tok, tgt_ids),
        tgt_out_pieces=piece(tgt_tok, tgt_ids) + ["</s>"],
        encoder_self=enc[0],
        decoder_self=dec[0],
        cross=cross[0],
    )
