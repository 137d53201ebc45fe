"""`tmt inspect`: the model as an indented tree with parameter counts and the tensor shapes of one batch.

The shapes are recorded from the real modules while one example batch runs through ``encode`` and ``decode``
(:func:`transformer_mt.analysis.traced`: forward hooks, and each attention's ``attend`` wrapped for the duration to
read Q, K, V per head, the mask and the score matrix), so the report is what the model computes. A config (no
weights) is built on the ``meta`` device: shapes and counts without allocating a big model's memory.

Parameter counts: every module's subtree, a matrix shared by several modules (tied embeddings) counted where it
first appears, so the lines add up and the total is ``sum(p.numel())`` over ``model.parameters()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from transformer_mt.analysis import describe, traced
from transformer_mt.config import Config, ModelConfig
from transformer_mt.model import Transformer
from transformer_mt.runtime import flops
from transformer_mt.text import DEFAULT, SpecialIds, language_tag, target_languages
from transformer_mt.viz.figures import VizError

# Table 3 of the paper (PAPER.md): sizes and parameter counts (37k shared BPE vocabulary);
# Table 2: training cost, estimated there as GPU time x sustained GPU speed, not counted.
PAPER = {
    "base": dict(n=6, d_model=512, d_ff=2048, heads=8, dk=64, params=65e6, cost=3.3e18, updates=100_000),
    "big": dict(n=6, d_model=1024, d_ff=4096, heads=16, dk=64, params=213e6, cost=2.3e19, updates=300_000),
}
PAPER_TOKENS_PER_UPDATE = 25_000  # section 5.1: ~25k source and ~25k target tokens per batch


@dataclass
class Node:
    """One line of the tree (and its children)."""

    name: str
    what: str  # module description
    params: int  # parameters first seen in this subtree
    calls: list[str] = field(default_factory=list)  # "in -> out" shapes, one per call
    details: list[str] = field(default_factory=list)  # attention internals
    children: list[Node] = field(default_factory=list)


_ROLE = {"in_weight": " = W^Q, W^K, W^V stacked (rows H*Dk, H*Dk, H*Dv)", "in_bias": " = their biases"}


def build_tree(model: nn.Module, calls: dict[str, list[str]], details: dict[str, list[str]]) -> Node:
    seen_modules: dict[int, str] = {}
    seen_params: dict[int, str] = {}

    def visit(name: str, module: nn.Module, short: str) -> Node:
        if id(module) in seen_modules:
            return Node(short, f"= {seen_modules[id(module)]} (the same module)", 0)
        seen_modules[id(module)] = name or "model"
        node = Node(short, describe(module), 0, calls.get(name, []))
        for pname, p in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            if id(p) in seen_params:
                node.details.append(f"{pname} is {seen_params[id(p)]} (tied, counted there)")
            else:
                seen_params[id(p)] = full
                node.params += p.numel()
                if module._modules:  # a module with children and weights of its own: name them
                    node.details.append(f"{pname} {tuple(p.shape)}{_ROLE.get(pname, '')}")
        node.details += details.get(name, [])  # attention internals after the weights
        for child_name, child in module._modules.items():
            if child is not None:
                kid = visit(f"{name}.{child_name}" if name else child_name, child, child_name)
                node.children.append(kid)
                node.params += kid.params
        return node

    root = visit("", model, "Transformer")
    for name, buf in model.named_buffers():
        root.details.append(f"buffer {name} {tuple(buf.shape)} (not a parameter: a function of the config)")
    return root


def render_tree(root: Node, *, full_layers: int = 1) -> list[str]:
    """Lines of the tree; in a ModuleList the first ``full_layers`` layers show their insides, the others one line."""
    out: list[str] = []

    def line(node: Node, depth: int, expand: bool) -> None:
        pad = "  " * depth
        shapes = "; ".join(node.calls)
        out.append(f"{pad + node.name:<28} {node.what:<44} {node.params:>13,}   {shapes}".rstrip())
        if not expand:
            return
        for d in node.details:
            out.append(f"{pad}    | {d}")
        for i, kid in enumerate(node.children):
            line(kid, depth + 1, expand=not (node.what.startswith("ModuleList") and i >= full_layers))

    line(root, 0, True)
    return out


def example_batch(
    src_len: int, tgt_len: int, *, vocab: int, device: torch.device | str, specials: SpecialIds = DEFAULT
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sentences: the first fills (S, T), the second is shorter, so the masks hold padding. src (2, S),
    tgt_in (2, T)."""
    gen = torch.Generator().manual_seed(0)
    words = torch.tensor([i for i in range(max(vocab, 5)) if i not in specials.kept_ids])  # no special ids
    ids = lambda n: words[torch.randint(len(words), (n,), generator=gen)].tolist()  # noqa: E731
    pad, eos, start = specials.pad, specials.eos, specials.start
    short_s, short_t = max(1, src_len - 3), max(1, tgt_len - 2)
    src = [ids(src_len - 1) + [eos], ids(short_s - 1) + [eos] + [pad] * (src_len - short_s)]
    tgt = [[start] + ids(tgt_len - 1), [start] + ids(short_t - 1) + [pad] * (tgt_len - short_t)]
    return torch.tensor(src, device=device), torch.tensor(tgt, device=device)


def _si(flop: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flop >= scale:
            return f"{flop / scale:.3g} {unit}"
    return f"{flop:.3g} FLOP"


def paper_size(m: ModelConfig) -> str | None:
    """'base' or 'big' when the config has that Table 3 size (layers, widths, heads, d_k)."""
    dk = m.head_dim or m.d_model // m.heads
    ours = (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.heads, dk)
    for name, p in PAPER.items():
        if ours == (p["n"], p["n"], p["d_model"], p["d_ff"], p["heads"], p["dk"]):
            return name
    return None


def inspect_report(
    model: Transformer,
    cfg: Config,
    *,
    vocab: tuple[int, int],
    source: str,
    src_len: int = 10,
    tgt_len: int = 8,
    full_layers: int = 1,
) -> tuple[list[str], dict]:
    """The report's lines, and its numbers (``total_params``, ``tree_params``, ``flops_per_token``)."""
    m = cfg.model
    device = next(model.parameters()).device
    src, tgt_in = example_batch(src_len, tgt_len, vocab=vocab[0], device=device, specials=model.specials)
    model.eval()
    with traced(model) as (calls, details), torch.no_grad():
        model.decode(tgt_in, model.encode(src))
    root = build_tree(model, calls, details)
    total = sum(p.numel() for p in model.parameters())
    dk, dv = m.head_dim or m.d_model // m.heads, m.value_dim or m.d_model // m.heads
    shared = (
        "shared source/target/output"
        if m.share_all_embeddings
        else "target/output tied"
        if m.share_decoder_embeddings
        else "untied"
    )
    lines = [
        f"tmt inspect {source}",
        f"model: {m.norm}-norm, {m.encoder_layers} encoder + {m.decoder_layers} decoder layers, d_model {m.d_model}, "
        f"{m.heads} heads (d_k {dk}, d_v {dv}), d_ff {m.d_ff} {m.activation}, {m.positions} positions; "
        f"vocabulary {vocab[0]:,} source / {vocab[1]:,} target ({shared})",
        f"parameters: {total:,} (sum of p.numel() over model.parameters(); a tied matrix counted once)",
        *_languages(cfg),
    ]
    size = paper_size(m)
    per = flops.per_target_token(m, vocab=vocab[1], src_len=src_len, tgt_len=tgt_len)
    per4 = flops.per_target_token(m, vocab=vocab[1], src_len=src_len, tgt_len=tgt_len, beam=4)
    if size:
        p = PAPER[size]
        est = p["updates"] * PAPER_TOKENS_PER_UPDATE * per["train"]
        lines.append(
            f"paper, Table 3 '{size}': {p['params'] / 1e6:.0f}M parameters with a 37k shared vocabulary; "
            f"this model {total / 1e6:.1f}M with {vocab[1]:,} pieces"
        )
        lines.append(
            f"paper, Table 2 '{size}': training cost {p['cost']:.1e} FLOPs (GPU time x sustained speed); "
            f"counted here: {p['updates']:,} updates x {PAPER_TOKENS_PER_UPDATE:,} target tokens x "
            f"{_si(per['train'])} = {est:.1e} FLOPs"
        )
    lines += [
        f"FLOPs per target token (matmuls, multiply-add = 2) for one {src_len}-token source and {tgt_len}-token "
        f"target: training {_si(per['train'])} (3 x forward), decoding {_si(per['decode'])} greedy / "
        f"{_si(per4['decode'])} beam 4 (KV cache)",
        "",
        f"example batch: B=2 sentences, source S={src_len} (2nd sentence {max(1, src_len - 3)} + padding), "
        f"target T={tgt_len} (2nd {max(1, tgt_len - 2)} + padding); shapes are input -> output of each call"
        + ("; built on the meta device (no weights)" if device.type == "meta" else ""),
        f"{'module':<28} {'type':<44} {'parameters':>13}   shapes",
        *render_tree(root, full_layers=full_layers),
    ]
    return lines, {"total_params": total, "tree_params": root.params, "flops_per_token": per, "root": root}


def _languages(cfg: Config) -> list[str]:
    """The line naming the target languages the config's corpora state (none stated: no line); an NLLB / M2M100
    model's language codes, which name both sides."""
    codes = cfg.model.decoder_languages.split()
    if codes:
        shown = ", ".join(codes[:20]) + (f" and {len(codes) - 20} more" if len(codes) > 20 else "")
        return [
            f"languages: {shown} (NLLB / M2M100: --src-lang and --tgt-lang pick two; the source starts with its code, "
            "the decoder with the target's)"
        ]
    languages = target_languages(cfg.data)
    if len(languages) > 1:
        tags = ", ".join(language_tag(lang) for lang in languages)
        return [
            f"target languages: {', '.join(languages)} (multilingual: --tgt-lang picks one; sources start with {tags})"
        ]
    return [f"target language: {languages[0]}"] if languages else []


def load_model(target: str | Path, overrides: list[str] | None = None) -> tuple[Transformer, Config, tuple[int, int]]:
    """A checkpoint (the weights tmt translate decodes with: EMA when present; CPU) or a YAML config (built on the
    meta device); vocab from the checkpoint's tokenizers or from ``tokenizer.vocab_size``."""
    from transformer_mt.config import load_config
    from transformer_mt.decoding import model_from_checkpoint

    target = Path(target)
    if target.suffix == ".pt":
        if overrides:
            raise VizError(f"{target}: --set applies to a YAML config, not a checkpoint (its architecture is fixed)")
        # the EMA weights when present, as tmt translate decodes
        model, cfg, src_tok, tgt_tok, _ = model_from_checkpoint(target)
        return model, cfg, (src_tok.vocab_size, tgt_tok.vocab_size)
    cfg = load_config(target, overrides or [], check_files=False)
    vocab = (cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size)
    with torch.device("meta"):
        model = Transformer(cfg.model, src_vocab_size=vocab[0], tgt_vocab_size=vocab[1])
    return model, cfg, vocab
