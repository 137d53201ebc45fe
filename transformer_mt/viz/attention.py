"""Attention maps of one sentence: encoder self, decoder self (causal) and cross-attention, every layer and head.

The weights come from :meth:`Transformer.attention`: the model's own layers and masks with the weights
requested, teacher-forcing either the model's translation (the search's hypothesis ids, so the maps are
those of the output ``tmt translate`` prints) or a given reference. Conventions, as in the JSON file:

* ``weights[layer][head][query][key]``, layers and heads 0-based like the module names (``encoder.0``);
* source positions: the source pieces + ``</s>``; decoder positions: the input ``<s> y1 .. yn`` as keys
  of the decoder self-attention, and each query row labelled by the piece that position *predicts*
  (``y1 .. yn </s>``), so cross-attention rows read as "to produce this piece, the model looked at...";
* every row sums to 1; decoder self-attention is 0 above the diagonal (position t sees inputs <= t).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.data import collate
from transformer_mt.viz import VizError, new_figure, save_figure

KINDS = {  # file stem: (title, query labels, key labels)
    "encoder_self": ("encoder self-attention", "src", "src"),
    "decoder_self": ("decoder self-attention (causal)", "tgt_out", "tgt_in"),
    "cross": ("cross-attention (decoder queries, encoder keys)", "tgt_out", "src"),
}


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
        """Keep these layers (of each stack that has them) and heads; VizError naming a number out of range."""
        n_enc, n_dec, n_heads = self.encoder_self.size(0), self.cross.size(0), self.cross.size(1)
        for name, picked, n in (("--layers", layers, max(n_enc, n_dec)), ("--heads", heads, n_heads)):
            bad = [i for i in picked or [] if not 0 <= i < n]
            if bad:
                raise VizError(f"{name} {','.join(map(str, bad))}: the model has {n} {name[2:]}, numbered 0 to {n - 1}")
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
            "convention": "weights[layer][head][query][key], rows sum to 1; encoder_self (L, H, S, S) over src_pieces; "
            "decoder_self (L, H, T, T): rows predict tgt_out_pieces, keys are tgt_in_pieces, 0 above the diagonal; "
            "cross (L, H, T, S): rows predict tgt_out_pieces, keys are src_pieces",
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
    stack = lambda ws: torch.stack([t.float().cpu() for t in ws], dim=1)  # noqa: E731 - L x (B, H, Q, K) -> (B, L, H, Q, K)
    return stack(w.encoder), stack(w.decoder), stack(w.cross), batch.src, batch.tgt_in


def sentence_maps(
    translator, source: str, *, reference: str | None = None, beam: int | None = None, lenpen: float | None = None
) -> AttentionMaps:
    """The maps of ``source`` translated by ``translator``'s model (or teacher-forcing ``reference``)."""
    from transformer_mt.decoding import translate_ids

    if not source.strip():
        raise VizError('the source sentence is empty; give one with --src "text" or FILE --line N')
    if not hasattr(translator.model, "attention"):
        raise VizError("attention maps are drawn for one model, not an ensemble; give one checkpoint (-c)")
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


def draw_kind(maps: AttentionMaps, kind: str, out: Path, *, dpi: int = 80):
    """One figure: a row per layer, a column per head plus the head average; pieces on both axes."""
    title, qkey, kkey = KINDS[kind]
    w = getattr(maps, kind)  # (L, H, Q, K)
    n_layers, n_heads, nq, nk = w.shape
    layer_ids = maps.layer_ids(kind)
    head_ids = maps.heads if maps.heads is not None else list(range(n_heads))
    cell = min(3.2, max(1.9, 0.16 * max(nq, nk)))
    fig = new_figure(cell * (n_heads + 1) + 0.6, cell * n_layers + 0.9)
    axes = fig.subplots(n_layers, n_heads + 1, squeeze=False, sharex=True, sharey=True)
    # sentencepiece's word-start mark U+2581 draws as a bar below the baseline in most fonts: show it as '_'
    qlab, klab = ([t.replace("\u2581", "_") for t in maps.labels(k)] for k in (qkey, kkey))
    small = max(4.0, min(8.0, 140 / max(nq, nk, 1)))
    for r in range(n_layers):
        for c in range(n_heads + 1):
            ax = axes[r, c]
            data = w[r, c] if c < n_heads else w[r].mean(0)  # (Q, K); the last column: mean over the heads
            # Each panel scaled 0 .. its own largest weight (diffuse heads would be uniformly dark on 0 .. 1); the title gives it.
            ax.imshow(
                data.numpy(),
                cmap="viridis",
                vmin=0.0,
                vmax=max(float(data.max()), 1e-6),
                interpolation="nearest",
                aspect="auto",
            )
            name = f"head {head_ids[c]}" if c < n_heads else "mean of heads"
            ax.set_title(f"layer {layer_ids[r]}, {name} (max {float(data.max()):.2f})", fontsize=7.5)
            ax.set_xticks(range(nk), klab, rotation=90, fontsize=small)
            ax.set_yticks(range(nq), qlab, fontsize=small)
            ax.tick_params(length=0, labelbottom=r == n_layers - 1, labelleft=c == 0)
    what = "reference (teacher-forced)" if maps.teacher_forced else "translation"
    fig.suptitle(f"{title}\nsource: {_clip(maps.source)}   {what}: {_clip(maps.target)}", fontsize=9)
    return save_figure(fig, out, dpi=dpi)


def _clip(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def write_maps(maps: AttentionMaps, out_dir: str | Path, *, svg: bool = False) -> list[Path]:
    """attention.json (raw weights) and one PNG (+ SVG) per kind in ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in KINDS:
        if getattr(maps, kind).size(0) == 0:  # --layers picked none of this stack's layers
            continue
        for suffix in (".png", ".svg") if svg else (".png",):
            paths.append(draw_kind(maps, kind, out_dir / f"{kind}{suffix}"))
    path = out_dir / "attention.json"
    path.write_text(json.dumps(maps.to_json()) + "\n", encoding="utf-8")
    return [path, *paths]


def parse_indices(text: str | None, option: str) -> list[int] | None:
    """ "0,2" -> [0, 2]; None or "all" -> None (everything)."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        picked = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise VizError(f"{option} {text!r}: expected comma-separated numbers such as 0,2 (0-based) or 'all'") from None
    if not picked:
        raise VizError(f"{option} {text!r}: expected comma-separated numbers such as 0,2 (0-based) or 'all'")
    return list(dict.fromkeys(picked))


def read_line(path: str | Path, line: int) -> str:
    """Line ``line`` (1-based) of a text file, read the way every tmt command reads text."""
    from transformer_mt.text import iter_file

    if line < 1:
        raise VizError(f"--line {line}: line numbers start at 1")
    for n, text in enumerate(iter_file(path), 1):
        if n == line:
            return text
    raise VizError(f"{path}: has fewer than {line} lines; choose --line between 1 and the file's line count")
