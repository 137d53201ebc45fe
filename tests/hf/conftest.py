"""MarianMT models built by transformers itself, for the import and export tests.

A tiny random ``MarianMTModel`` (d_model 32, 2+2 layers) with a ``MarianTokenizer`` whose sentencepiece models
are trained on a Multi30k slice and whose vocabularies follow OPUS-MT's conversion: ``</s>`` 0, ``<unk>`` 1,
the pieces, ``<pad>`` last; config.json's pad_token_id and decoder_start_token_id are the source vocabulary's
``<pad>``. Shared: one vocab.json over the pieces of both models; separate: vocab.json (English) and a larger
target_vocab.json (German). Saved with save_pretrained, as from the Hub.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import head

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@dataclass(frozen=True)
class MarianDir:
    """A MarianMT directory written by save_pretrained, and how it was built."""

    path: Path
    shared: bool
    activation: str


def train_spm(lines: list[str], vocab_size: int, *, model_type: str = "unigram") -> bytes:
    """A sentencepiece model (unigram: Marian's; bpe: NLLB's) with sentencepiece's own default ids (unk 0, bos 1,
    eos 2)."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=vocab_size,
        model_type=model_type,
        minloglevel=2,
        num_threads=1,
    )
    return out.getvalue()


def marian_vocab(*protos: bytes) -> dict[str, int]:
    """OPUS-MT's vocab.json order: </s> 0, <unk> 1, every normal piece of the models (first seen first), <pad> last."""
    import sentencepiece as spm

    pieces = ["</s>", "<unk>"]
    seen = set(pieces)
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    return {p: i for i, p in enumerate([*pieces, "<pad>"])}


def randomize(model, seed: int, *, scale: float, eos_bias: float) -> None:
    """Weights far from transformers' init (N(0, 0.02), LayerNorm 1 and 0, a zero final_logits_bias), so that every
    tensor matters to the output and a swapped or dropped one shows. Small embeddings and larger projections keep a
    random model from repeating one piece for every input (its outputs differ from line to line), and a raised EOS
    bias lets some greedy outputs end with EOS while others run to the length limit: both endings are compared.
    (Which scales do that depends on the activation: random relu stacks collapse onto fewer outputs.)"""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((0.05 if "embed" in name or "shared" in name else scale) * torch.randn(p.shape, generator=g))
        model.final_logits_bias.copy_(0.1 * torch.randn(model.final_logits_bias.shape, generator=g))
        model.final_logits_bias[0, model.config.eos_token_id] += eos_bias


def build_marian_dir(
    root: Path,
    multi30k: Path,
    *,
    shared: bool,
    activation: str,
    seed: int = 0,
    scale: float = 0.3,
    eos_bias: float = 0.7,
) -> MarianDir:
    en, de = head(multi30k / "train.en", 2000), head(multi30k / "train.de", 2000)
    src_proto, tgt_proto = train_spm(en, 250), train_spm(de, 350)
    root.mkdir(parents=True, exist_ok=True)
    (root / "src.spm").write_bytes(src_proto)
    (root / "tgt.spm").write_bytes(tgt_proto)
    src_vocab = marian_vocab(src_proto, tgt_proto) if shared else marian_vocab(src_proto)
    tgt_vocab = src_vocab if shared else marian_vocab(tgt_proto)
    (root / "vocab.json").write_text(json.dumps(src_vocab), encoding="utf-8")
    (root / "target_vocab.json").write_text(json.dumps(tgt_vocab), encoding="utf-8")
    tok = transformers.MarianTokenizer(
        str(root / "src.spm"),
        str(root / "tgt.spm"),
        str(root / "vocab.json"),
        target_vocab_file=None if shared else str(root / "target_vocab.json"),
        separate_vocabs=not shared,
    )
    pad = src_vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(src_vocab),
        decoder_vocab_size=len(tgt_vocab),
        share_encoder_decoder_embeddings=shared,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function=activation,
        max_position_embeddings=128,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    randomize(model, seed, scale=scale, eos_bias=eos_bias)
    out = root / "hf"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return MarianDir(out, shared, activation)


@pytest.fixture(scope="session")
def marian_dir(multi30k, tmp_path_factory) -> MarianDir:
    """A tiny MarianMT directory with a shared vocabulary, built once per run: tests that change it work on a copy."""
    return build_marian_dir(tmp_path_factory.mktemp("marian_base"), multi30k, shared=True, activation="swish")


def copy_marian(marian: MarianDir, to: Path) -> Path:
    """A copy of ``marian``'s directory at ``to`` (which must not exist), to change."""
    shutil.copytree(marian.path, to)
    return to


def edit_json(path: Path, change: Callable[[Any], Any] | dict[str, Any]) -> None:
    """Rewrite the JSON file ``path``: ``change`` a dict of keys to set, or a function of the parsed value returning
    the new one (it may return something of another type)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data = {**data, **change} if isinstance(change, dict) else change(data)
    path.write_text(json.dumps(data), encoding="utf-8")
