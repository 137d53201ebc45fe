"""The Transformer of "Attention Is All You Need": the encoder-decoder and its entry points.

Entry points, each with one return type: :meth:`Transformer.encode` -> EncoderOut,
:meth:`Transformer.decode` (teacher forcing) -> logits, :meth:`Transformer.init_cache` +
:meth:`Transformer.decode_step` (incremental decoding, what search uses) -> logits,
:meth:`Transformer.attention` -> AttentionWeights (every layer's weights, for inspection); and for sentences packed
end to end without padding (training), :meth:`Transformer.encode_packed` -> PackedEncoderOut and
:meth:`Transformer.decode_packed` -> logits. The training loss is a module around the model:
:class:`transformer_mt.model.loss.TeacherForcedLoss`.

Its parts, one idea per module: attention and the mask convention (:mod:`~transformer_mt.model.attention`),
the layers (:mod:`~transformer_mt.model.layers`), the norms, ``model.norm`` and FixNorm
(:mod:`~transformer_mt.model.norms`), positions (:mod:`~transformer_mt.model.positions`), the output layer and
``model.restrict_output`` (:mod:`~transformer_mt.model.output`), the decoder's KV cache
(:mod:`~transformer_mt.model.cache`). Positions and the output layer are mixed into :class:`Transformer` rather
than made submodules, so that every tensor keeps its checkpoint name.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dk query/key size per head,
Dv value size per head, V vocabulary, L decoder layers. Masks: padding masks True = padding position,
attention masks True = attend (:mod:`~transformer_mt.model.attention`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_mt.config import ConfigError, ModelConfig, specials_problem
from transformer_mt.model.attention import AttentionMask, BlockDiagonal, MultiHeadAttention, Segments, allowed_mask
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.layers import DecoderLayer, EncoderLayer, TypedModuleList
from transformer_mt.model.norms import ScaleNorm, fixnorm, is_pre_norm, norm_layer
from transformer_mt.model.ops import Ops, choose_ops
from transformer_mt.model.output import OutputLayer
from transformer_mt.model.positions import PositionTable
from transformer_mt.model.static_cache import StaticBuffers, StaticDecoderCache
from transformer_mt.text import SpecialIds


class EncoderOut(NamedTuple):
    """What :meth:`Transformer.encode` returns, and what :meth:`Transformer.decode` and
    :meth:`Transformer.init_cache` take."""

    memory: Tensor  # (B, S, D) encoder output
    src_pad: Tensor  # (B, S) bool, True at padding positions
    allowed: Tensor | None  # (B, 1, 1, S) bool attention mask over the source (True = attend); None: no row has padding


class PackedEncoderOut(NamedTuple):
    """What :meth:`Transformer.encode_packed` returns, and what :meth:`Transformer.decode_packed` takes."""

    memory: Tensor  # (Ns, D) encoder output of the packed sources
    segments: Segments  # the sources' lengths (cu_seqlens, max_len) and each token's position


class AttentionWeights(NamedTuple):
    """What :meth:`Transformer.attention` returns: per layer (bottom first), the attention weights of one
    teacher-forced pass, heads kept apart, taken after the softmax and before attention dropout; keys the
    mask blocks get exactly 0, and every row sums to 1 (a row with no allowed key attends everywhere)."""

    encoder: tuple[Tensor, ...]  # per encoder layer: self-attention (B, H, S, S), 0 on source padding keys
    decoder: tuple[
        Tensor, ...
    ]  # per decoder layer: masked self-attention (B, H, T, T), 0 above the diagonal and on padding keys
    cross: tuple[Tensor, ...]  # per decoder layer: attention over the encoder output (B, H, T, S), 0 on source padding
    logits: Tensor  # (B, T, V_tgt) of the same pass, equal to decode()'s up to float rounding


def _check(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
    choices = (
        ("norm", ("post", "pre", "scale")),
        ("activation", ("relu", "gelu", "swish")),
        ("positions", ("sinusoidal", "learned")),
        ("position_layout", ("interleaved", "halves", "fairseq")),
    )
    for key, allowed in choices:
        if getattr(cfg, key) not in allowed:
            raise ConfigError(f"model.{key}={getattr(cfg, key)!r} is not one of {', '.join(allowed)}")
    if cfg.positions == "learned" and cfg.position_layout != "interleaved":
        raise ConfigError(
            f"model.position_layout={cfg.position_layout!r} orders sinusoids only; "
            "remove it or set model.positions: sinusoidal"
        )
    if (not cfg.head_dim or not cfg.value_dim) and cfg.d_model % cfg.heads:
        raise ConfigError(
            f"model.d_model={cfg.d_model} is not divisible by model.heads={cfg.heads}; "
            "choose d_model as a multiple of heads or set model.head_dim and model.value_dim"
        )
    problem = specials_problem(cfg, min(src_vocab_size, tgt_vocab_size))
    if problem:
        raise ConfigError(str(problem))
    if cfg.share_all_embeddings and src_vocab_size != tgt_vocab_size:
        raise ConfigError(
            "model.share_all_embeddings needs one vocabulary, but "
            f"src_vocab_size={src_vocab_size} != tgt_vocab_size={tgt_vocab_size}; "
            "use a joint tokenizer (tokenizer.joint: true) or set model.share_all_embeddings: false"
        )


class Transformer(PositionTable, OutputLayer):
    """Encoder-decoder Transformer (section 3). Token ids are padded with ``specials.pad`` (the ``model.*_id`` keys);
    masks follow :mod:`~transformer_mt.model.attention` (padding masks True = pad; attention masks True = attend).

    ``ops``: the backend that computes the operations with fast paths (:mod:`transformer_mt.model.ops`), held by the
    model and read by every submodule that uses one; None: ``choose_ops("auto")`` for the CPU, where a model is built.
    A model moved to another device gets that device's backend with :meth:`use_ops`."""

    def __init__(self, cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int, ops: Ops | None = None):
        super().__init__()
        _check(cfg, src_vocab_size, tgt_vocab_size)
        d = cfg.d_model
        self.cfg = cfg
        self.ops: Ops = ops if ops is not None else choose_ops()
        self.specials = SpecialIds.of(cfg)
        pad = self.specials.pad
        self.embed_scale = math.sqrt(d)  # section 3.4: embeddings multiplied by sqrt(d_model)
        self.dropout = cfg.dropout
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=pad)
        # Section 3.4: one matrix for both embeddings and the pre-softmax layer (joint vocabulary); with
        # separate vocabularies only the target embedding and the output layer can share.
        self.tgt_embed = (
            self.src_embed if cfg.share_all_embeddings else nn.Embedding(tgt_vocab_size, d, padding_idx=pad)
        )
        # model.output_bias: a (V,) bias on the logits (MarianMT's final_logits_bias), its own even when the weight is
        # tied
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=cfg.output_bias)
        if cfg.share_all_embeddings or cfg.share_decoder_embeddings:
            self.output_proj.weight = self.tgt_embed.weight
        self._init_positions(cfg)
        self.encoder = TypedModuleList(EncoderLayer(cfg, ops=self.ops) for _ in range(cfg.encoder_layers))
        self.decoder = TypedModuleList(DecoderLayer(cfg, ops=self.ops) for _ in range(cfg.decoder_layers))
        # Pre-norm leaves the residual stream unnormalised: one final norm per stack (ScaleNorm's too).
        self.encoder_norm = norm_layer(cfg, ops=self.ops) if is_pre_norm(cfg) else None
        self.decoder_norm = norm_layer(cfg, ops=self.ops) if is_pre_norm(cfg) else None
        self.fix_norm = cfg.norm == "scale"  # FixNorm: unit-length word embeddings and output rows (model.norms)
        self._init_output(cfg, tgt_vocab_size)  # the kept pieces of model.restrict_output
        self._init_weights()

    def _init_weights(self) -> None:
        # fairseq practice (transformer.py Embedding/Linear helpers): Xavier-uniform projections with
        # zero biases keep activations unit-scale through the stack; embeddings ~ N(0, d^-0.5) so that
        # after the sqrt(d) scale they are unit-scale too, which also suits a tied output layer; the
        # PAD row is zero so padding adds nothing (padding_idx keeps lookups from updating it).
        std = self.cfg.d_model**-0.5
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.reset_parameters()
            elif isinstance(module, nn.Linear) and module is not self.output_proj:
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])
        if self.output_proj.weight is not self.tgt_embed.weight:
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=std)
        if self.output_proj.bias is not None:  # model.output_bias starts at zero: the logits start as without it
            nn.init.zeros_(self.output_proj.bias)

    def use_ops(self, ops: Ops) -> Transformer:
        """Compute with the backend ``ops`` from now on (e.g. ``choose_ops("auto", device)`` after moving the model to
        ``device``), in this model and every submodule that holds one. Returns the model."""
        for module in self.modules():
            attributes = vars(module)
            if "ops" in attributes:  # the modules that compute through a backend hold it as a plain attribute
                attributes["ops"] = ops
        return self

    def cast_weights(self, dtype: torch.dtype) -> Transformer:
        """Inference in reduced precision (``tmt translate --dtype bfloat16/float16``): every matmul weight
        and embedding table in ``dtype``, cast once (cheaper per step than autocast); LayerNorm and ScaleNorm parameters
        and the sinusoid table stay float32 (:class:`LayerNorm` normalises in float32; the positions are
        added in float32). Returns the model."""
        for module in self.modules():
            if module is not self and not isinstance(
                module, (nn.LayerNorm, ScaleNorm)
            ):  # the pe buffer is the model's own
                module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t, recurse=False)
        return self

    def _embed(self, embed: nn.Embedding, tokens: Tensor, *, start: int | Tensor = 0) -> Tensor:
        """(B, T) ids at positions [start, start + T) -> (B, T, D): scaled embedding + position, dropout.
        With weights cast to bf16 / fp16 the sum is taken with the float32 sinusoids, then rounded once.
        ``start`` a (1,) long tensor (a static cache's position, T = 1): the position is looked up on the device."""
        e = embed(tokens)
        if self.fix_norm:  # FixNorm: each looked-up row to length 1 (in float32), then the sqrt(d) scale below
            e = fixnorm(e.float(), ops=self.ops).to(e.dtype)
        if isinstance(start, Tensor):  # no host sync: the static cache sized its positions against the table
            table = self.pos_embed.weight if self.learned_positions else self.pe
            positions = table.index_select(0, start)  # (1, D)
        else:
            positions = self._positions(start, tokens.size(1))  # (T, D)
        x = (e * self.embed_scale + positions).to(e.dtype)
        return self.ops.dropout(x, self.dropout, self.training)  # section 5.4: dropout on embeddings + positions

    def encode(self, src: Tensor, *, padded: bool = True) -> EncoderOut:
        """src (B, S) ids padded with the pad id -> EncoderOut(memory (B, S, D), src_pad (B, S) True = pad, allowed).

        ``padded=False`` states that no row of ``src`` holds padding (the trainer knows it from the collated
        lengths, without asking the device): attention over the source then runs without a key mask."""
        return self._encode(src, padded=padded)[0]

    def _encode(self, src: Tensor, *, padded: bool = True, need_weights: bool = False) -> tuple[EncoderOut, list]:
        """:meth:`encode`, plus each encoder layer's self-attention weights (B, H, S, S) if asked (else Nones)."""
        src_pad = src.eq(self.specials.pad)
        allowed = allowed_mask(src_pad) if padded else None  # (B, 1, 1, S)
        x, weights = self._encoder_stack(self._embed(self.src_embed, src), allowed, need_weights=need_weights)
        return EncoderOut(x, src_pad, allowed), weights

    def _encoder_stack(
        self, x: Tensor, allowed: AttentionMask, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor | None]]:
        """Embedded sources (B, S, D) through every encoder layer and the final norm -> (B, S, D), and each layer's
        self-attention weights if asked (else Nones)."""
        weights = []
        for layer in self.encoder:
            x, w = layer(x, allowed, need_weights=need_weights)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, weights

    def decode(self, tgt_in: Tensor, enc: EncoderOut, *, keep: Tensor | None = None) -> Tensor:
        """Teacher forcing: tgt_in (B, T) = start + target, right-padded with the pad id -> logits (B, T, V_tgt).

        A real position t sees target positions <= t (causal; right padding puts no pad among them) and
        non-pad source positions; the logits at padded positions are of no use (they may see padding).
        ``keep`` (B, T) bool: return logits (N, V_tgt) for the N positions where it is True, in row-major
        order (the vocabulary projection, the largest matmul of a small model, then skips the others).
        """
        x = self.decoder_output(tgt_in, enc)
        if keep is not None:
            x = x[keep]  # (B, T, D) -> (N, D)
        return self.logits(x)

    def attention(self, src: Tensor, tgt_in: Tensor) -> AttentionWeights:
        """Teacher-force tgt_in (B, T) = BOS + target on src (B, S) and return every layer's attention
        weights: encoder self (B, H, S, S), decoder self (B, H, T, T), cross (B, H, T, S), and the logits.

        The same layers and masks as :meth:`encode` / :meth:`decode`, with the weights requested
        (``need_weights``): the product is spelled out instead of a fused kernel. Call it in eval mode (no dropout) to
        see the weights decoding uses; to see them for a translation, pass BOS + its tokens as ``tgt_in``.
        """
        enc, encoder = self._encode(src, need_weights=True)
        x, decoder = self._decoder_states(tgt_in, enc, need_weights=True)
        return AttentionWeights(
            tuple(encoder), tuple(w.self_attn for w in decoder), tuple(w.cross_attn for w in decoder), self.logits(x)
        )

    def _decoder_states(self, tgt_in: Tensor, enc: EncoderOut, *, need_weights: bool = False) -> tuple[Tensor, list]:
        """tgt_in (B, T) -> the top decoder states (B, T, D) (after the final norm), and attention weights if asked.

        Self-attention is causal only (SDPA's ``is_causal``, no mask tensor; see :mod:`~transformer_mt.model.attention`)
        unless the weights are asked for: those are exactly 0 on padding keys too, so they get the full mask."""
        self_allowed = allowed_mask(self._target_padding(tgt_in), causal=True) if need_weights else None  # (B, 1, T, T)
        x = self._embed(self.tgt_embed, tgt_in)
        return self._decoder_stack(
            x,
            enc.memory,
            self_allowed,
            causal=self_allowed is None,
            cross_allowed=enc.allowed,
            need_weights=need_weights,
        )

    def _decoder_stack(
        self,
        x: Tensor,
        memory: Tensor,
        self_allowed: AttentionMask,
        *,
        causal: bool,
        cross_allowed: AttentionMask,
        need_weights: bool = False,
    ) -> tuple[Tensor, list]:
        """Embedded decoder inputs (B, T, D) over the encoder output ``memory`` (B, S, D) through every decoder layer
        and the final norm -> (B, T, D), and each layer's attention weights if asked (else Nones)."""
        weights = []
        for layer in self.decoder:
            k, v = layer.cross_attn.project_kv(memory)
            x, w = layer(
                x,
                k,
                v,
                self_allowed=self_allowed,
                causal=causal,
                cross_allowed=cross_allowed,
                need_weights=need_weights,
            )
            weights.append(w)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x, weights

    def _target_padding(self, tgt_in: Tensor) -> Tensor:
        """(B, T) bool, True at the padding of a decoder input. Position 0 holds the start id, never padding, even
        where the start is the pad id (MarianMT's decoder starts from it)."""
        pad = tgt_in.eq(self.specials.pad)
        pad[:, 0] = False
        return pad

    def decoder_output(self, tgt_in: Tensor, enc: EncoderOut) -> Tensor:
        """Teacher forcing up to the vocabulary projection: tgt_in (B, T) -> the top decoder states (B, T, D)
        (after the final norm). :class:`~transformer_mt.model.loss.TeacherForcedLoss` computes the projection
        (:meth:`output_weight`, :meth:`output_bias`) with the loss (``ops.projected_loss``, fused by the cpu and cuda
        backends, so that the (N, V) logits are never built in one piece)."""
        return self._decoder_states(tgt_in, enc)[0]

    # ---------------------------------------------------------------- packed sentences, no padding
    def _embed_packed(self, embed: nn.Embedding, tokens: Tensor, segments: Segments) -> Tensor:
        """(N,) ids of sentences packed end to end -> (1, N, D): :meth:`_embed`, each token at its position in its
        sentence (``segments.positions``)."""
        e = embed(tokens)[None]  # (N,) -> (1, N, D)
        if self.fix_norm:
            e = fixnorm(e.float(), ops=self.ops).to(e.dtype)
        table = self._positions(0, segments.max_len)  # (max_len, D): refuses a sentence longer than the table
        x = (e * self.embed_scale + table.index_select(0, segments.positions)).to(e.dtype)  # (1, N, D)
        return self.ops.dropout(x, self.dropout, self.training)

    def encode_packed(self, src: Tensor, segments: Segments) -> PackedEncoderOut:
        """Sources packed end to end, src (Ns,) = each sentence's pieces + EOS, their lengths and positions in
        ``segments`` -> PackedEncoderOut(memory (Ns, D)). Each sentence attends to itself alone (a
        :class:`~transformer_mt.model.attention.BlockDiagonal` mask), so its rows are :meth:`encode`'s at its real
        positions, up to float rounding (dropout masks aside); nothing is computed on padding."""
        x, _ = self._encoder_stack(self._embed_packed(self.src_embed, src, segments), BlockDiagonal(segments, segments))
        return PackedEncoderOut(x[0], segments)  # (1, Ns, D) -> (Ns, D)

    def decoder_output_packed(self, tgt_in: Tensor, segments: Segments, enc: PackedEncoderOut) -> Tensor:
        """Teacher forcing on packed sentences up to the vocabulary projection: tgt_in (Nt,) = each sentence's start
        + target pieces end to end, in the order of ``enc``'s sources -> the top decoder states (Nt, D). A token sees
        its sentence's positions up to its own and its own source's: :meth:`decoder_output`'s rows at the labels."""
        x, _ = self._decoder_stack(
            self._embed_packed(self.tgt_embed, tgt_in, segments),
            enc.memory[None],  # (Ns, D) -> (1, Ns, D)
            BlockDiagonal(segments, segments),
            causal=True,  # section 3.2.3, within each sentence
            cross_allowed=BlockDiagonal(segments, enc.segments),
        )
        return x[0]  # (1, Nt, D) -> (Nt, D)

    def decode_packed(self, tgt_in: Tensor, segments: Segments, enc: PackedEncoderOut) -> Tensor:
        """:meth:`decoder_output_packed` through the output layer: tgt_in (Nt,) -> logits (Nt, V_tgt)."""
        return self.logits(self.decoder_output_packed(tgt_in, segments, enc))

    def forward(self, src: Tensor, tgt_in: Tensor, *, keep: Tensor | None = None) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V_tgt), or (N, V_tgt) for the positions where ``keep`` is True.

        The training loss is :class:`~transformer_mt.model.loss.TeacherForcedLoss`, a module around this model.
        """
        return self.decode(tgt_in, self.encode(src), keep=keep)

    def init_cache(self, enc: EncoderOut) -> DecoderCache:
        """Start incremental decoding of a batch: project the encoder output to every layer's cross K/V once, and
        take the output layer's matrix (FixNorm, kept rows) once (:meth:`step_output`)."""
        ks, vs = zip(*(layer.cross_attn.project_kv(enc.memory) for layer in self.decoder))
        return DecoderCache(
            torch.stack(ks), torch.stack(vs), enc.src_pad, enc.allowed, output=self.step_output()
        )  # (L, B, H, S, Dk|Dv)

    def init_static_cache(self, enc: EncoderOut, *, max_len: int) -> StaticDecoderCache:
        """:meth:`init_cache` with a :class:`StaticDecoderCache`: self-attention K/V preallocated to ``max_len``
        positions (the batch's longest output) and written in place, the shapes and addresses a step captured as a
        CUDA graph needs (:mod:`transformer_mt.model.static_cache`). Its steps give the growing cache's logits up to
        float rounding."""
        self._positions(0, max_len)  # refuses more positions than the table holds, here rather than mid-search
        ks, vs = zip(*(layer.cross_attn.project_kv(enc.memory) for layer in self.decoder))
        cross_k, cross_v = torch.stack(ks), torch.stack(vs)  # (L, B, H, S, Dk|Dv)
        b, s = cross_k.size(1), cross_k.size(3)
        buffers = StaticBuffers.around(cross_k, cross_v, enc.allowed, max_len=max_len)
        return StaticDecoderCache(buffers, rows=b, groups=b, src_len=s, output=self.step_output())

    def decode_step(self, tokens: Tensor, cache: DecoderCache | StaticDecoderCache) -> Tensor:
        """tokens (B,): the newest token of each row (the start id first), at position ``cache.position``
        -> logits (B, V_tgt) for the next token, or (B, K) over the kept ids after ``cache.restrict_logits()``.
        Only the new position is computed; its self-attention K/V are written to ``cache``, which then advances by
        one. With a static cache nothing is read back from the device (the step can be captured as a CUDA graph)."""
        x = self._embed(self.tgt_embed, tokens[:, None], start=cache.position)  # (B,) -> (B, 1, D)
        for i, layer in enumerate(self.decoder):
            x = layer.step(x, cache, i)  # a single query per row over the cache (masked to its past if static)
        cache.advance()
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if cache.output is None:  # a cache built by hand, without the output layer's matrix
            return self.logits(x[:, 0])  # (B, 1, D) -> (B, V)
        return self.step_logits(x[:, 0], cache.output, kept_only=cache.kept_only)  # (B, 1, D) -> (B, V) or (B, K)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars, a shared (tied) matrix counted once: ``parameters()`` yields each
    Parameter object once."""
    return sum(p.numel() for p in model.parameters())
