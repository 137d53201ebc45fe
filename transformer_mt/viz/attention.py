"""`tmt attention`'s pictures and files: one figure per kind of attention (encoder self, decoder self, cross),
a row per layer and a column per head, and ``attention.json``, the weights of an
:class:`~transformer_mt.analysis.AttentionMaps` (``transformer_mt.analysis.attention`` states the conventions);
and the command's ``--layers`` / ``--heads`` and ``FILE --line N``.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformer_mt.analysis import AttentionMaps
from transformer_mt.viz.figures import VizError, new_figure, save_figure

KINDS = {  # file stem: (title, query labels, key labels)
    "encoder_self": ("encoder self-attention", "src", "src"),
    "decoder_self": ("decoder self-attention (causal)", "tgt_out", "tgt_in"),
    "cross": ("cross-attention (decoder queries, encoder keys)", "tgt_out", "src"),
}


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
            # Each panel scaled 0 .. its own largest weight (diffuse heads would be uniformly dark on 0 .. 1); the
            # title gives it.
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
