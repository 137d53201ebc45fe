"""The Transformer of "Attention Is All You Need": positions, attention, layers (the decoder cache is in cache.py).

Entry points, each with one return type: :meth:`Transformer.encode` -> EncoderOut,
:meth:`Transformer.decode` (teacher forcing) -> logits, :meth:`Transformer.init_cache` +
:meth:`Transformer.decode_step` (incremental decoding, what search uses) -> logits,
:meth:`Transformer.attention` -> AttentionWeights (every layer's weights, for inspection). The training
loss is a module around the model: :class:`transformer_mt.model.loss.TeacherForcedLoss`.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dk query/key size per head,
Dv value size per head, V vocabulary, L decoder layers.

Mask convention (one for the whole module):
  * padding masks (``src_pad``, ``tgt_pad``) are bool, **True = padding position**; they are what
    callers see (``EncoderOut.src_pad``, ``DecoderCache.src_pad``), built from ``PAD_ID``.
  * attention masks (``allowed``) are bool, **True = this query may attend to this key**, the convention
    of ``F.scaled_dot_product_attention``; they broadcast as (B, 1, 1, S) for key padding or
    (B, 1, T, T) for causal + key padding, and are built only by :func:`_allowed` from padding masks.
    :func:`_allowed` never leaves a query row with no key (an all-pad row would softmax to NaN, and
    NaN values leak through later layers even under zero weights): such a row may attend everywhere.
  * no mask at all where none is needed, so that SDPA may pick its fastest kernel (flash attention takes
    ``is_causal`` but no explicit mask on GPUs): the teacher-forced decoder's self-attention is causal
    only (``is_causal=True``): ``tgt_in`` is right-padded (BOS + target, ``data.collate``), so a real
    position's past holds no padding, and padded positions, whose outputs nothing reads, may see padding;
    a source without padding (``encode(src, padded=False)``, stated by a caller that knows it from the
    collated lengths) gets no key mask. Both give the masked path's numbers bit for bit on CPU (tests).

Normalisation (``model.norm``): post (the paper: LayerNorm after each residual add), pre (LayerNorm on each
sublayer's input, plus one final LayerNorm per stack), or scale, "Transformers without Tears" (Nguyen &
Salazar 2019) as the authors' code (tnq177/transformers_without_tears) runs it: pre placement with
:class:`ScaleNorm` g * x / max(||x||_2, 1e-5) (one learned scalar g per norm, initialised to sqrt(d_model))
in place of every LayerNorm, and FixNorm: every word-embedding row is l2-normalised to length 1 before the
sqrt(d_model) input scale, so the input embeddings have the fixed length sqrt(d_model) (the paper's fixed g),
and the output layer scores with the normalised rows too (tied: the same matrix; untied: its own rows), so a
logit is the final ScaleNorm's g times a cosine. Only the rows' directions are learned; the PAD row stays 0.

Output layer (``model.restrict_output``): the logits of the pieces in the ``output_ids`` buffer only (the
target side of the training data plus PAD, UNK, BOS and EOS, ids ascending, so the four special ids keep
their index; set by :meth:`Transformer.restrict_output_to`, saved in the state dict). The training loss
(``TeacherForcedLoss``) works in the K kept pieces (:meth:`Transformer.output_weight`,
:meth:`Transformer.output_targets`); every entry point that returns logits (``decode``, ``decode_step``,
``attention``) returns them over the full vocabulary with -inf at the pieces that are not kept, so search,
ensembles, export and callers see full-vocabulary ids, never a restricted index (the simpler of the two ways:
the other, searching over restricted indices and mapping them back, would change the search protocol and
the ensemble). Measured on the recipe (d_model 128, joint 10k vocabulary, 69% kept on Multi30k's German):
training ~6% faster per update (15% fewer matmul FLOPs); a decoding step the same within noise, since the
scatter into (rows, V) costs about what the skipped V - K rows of a 128-deep matmul save.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_mt.config import ConfigError, ModelConfig
from transformer_mt.model.cache import DecoderCache
from transformer_mt.model.kernels import dropout
from transformer_mt.text import EOS_ID, PAD_ID, UNK_ID


class EncoderOut(NamedTuple):
    memory: Tensor  # (B, S, D) encoder output
    src_pad: Tensor  # (B, S) bool, True at padding positions
    allowed: Tensor | None  # (B, 1, 1, S) bool attention mask over the source (True = attend); None: no row has padding


class LayerAttention(NamedTuple):
    """Attention weights of one decoder layer (heads kept apart), as :class:`DecoderLayer` returns them when asked."""

    self_attn: Tensor  # (B, H, T, T), exactly 0 on future and padding keys
    cross_attn: Tensor  # (B, H, T, S), exactly 0 on source padding


class AttentionWeights(NamedTuple):
    """What :meth:`Transformer.attention` returns: per layer (bottom first), the attention weights of one
    teacher-forced pass, heads kept apart, taken after the softmax and before attention dropout; keys the
    mask blocks get exactly 0, and every row sums to 1 (a row with no allowed key attends everywhere)."""

    encoder: tuple[Tensor, ...]  # per encoder layer: self-attention (B, H, S, S), 0 on source padding keys
    decoder: tuple[Tensor, ...]  # per decoder layer: masked self-attention (B, H, T, T), 0 above the diagonal and on padding keys
    cross: tuple[Tensor, ...]  # per decoder layer: attention over the encoder output (B, H, T, S), 0 on source padding
    logits: Tensor  # (B, T, V_tgt) of the same pass, equal to decode()'s up to float rounding


def _allowed(pad: Tensor, *, causal: bool = False) -> Tensor:
    """Padding mask (B, K) True = pad -> attention mask True = attend: (B, 1, 1, K), or (B, 1, K, K) if causal."""
    allowed = ~pad[:, None, None, :]  # (B, K) -> (B, 1, 1, K)
    if causal:  # section 3.2.3: position i sees positions <= i
        allowed = allowed & torch.ones(pad.size(1), pad.size(1), dtype=torch.bool, device=pad.device).tril()
    # A row with no allowed key (all-pad sentence, or a left-pad query) attends everywhere instead of giving NaN.
    return allowed | ~allowed.any(-1, keepdim=True)


def sinusoids(length: int, d_model: int, *, device: torch.device | str | None = None) -> Tensor:
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same); returns (length, d_model) float32."""
    # float64 for the angles: pos * 10000^(-2i/d) in float32 is off by ~1e-4 rad at pos ~ 1000.
    pos = torch.arange(length, dtype=torch.float64, device=device)[:, None]  # (length, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)  # (ceil(d/2),)
    angles = pos * inv_freq  # (length, ceil(d/2))
    pe = torch.empty(length, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()[:, : d_model // 2]  # odd d_model has one sine more than cosines
    return pe.float()


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters, same state dict) that normalises in its parameters' dtype when the
    input has another: weights cast to bfloat16 / float16 for inference (:meth:`Transformer.cast_weights`)
    keep the norms in float32, where the mean and variance of a 512-wide row do not lose 8 bits."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype:
            return super().forward(x)
        return F.layer_norm(x.to(self.weight.dtype), self.normalized_shape, self.weight, self.bias, self.eps).to(x.dtype)


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, eq. 5): (..., D) -> g * x / max(||x||_2, eps) over the last dimension, one
    learned scalar ``g`` initialised to sqrt(D) (x / ||x|| * sqrt(D) has unit RMS, as LayerNorm's output has).
    Like :class:`LayerNorm`, it normalises in g's dtype (float32) when the input has another."""

    def __init__(self, d_model: int, *, eps: float = 1e-5):
        super().__init__()
        self.g = nn.Parameter(torch.tensor(math.sqrt(d_model)))  # () scalar; the authors' initial value
        self.d_model, self.eps = d_model, eps

    def forward(self, x: Tensor) -> Tensor:
        y = x.to(self.g.dtype)
        return (y * (self.g / y.norm(dim=-1, keepdim=True).clamp(min=self.eps))).to(x.dtype)


def _norm(cfg: ModelConfig) -> nn.Module:
    """The normalisation layer ``model.norm`` asks for: ScaleNorm for scale, else LayerNorm."""
    return ScaleNorm(cfg.d_model) if cfg.norm == "scale" else LayerNorm(cfg.d_model)


class MultiHeadAttention(nn.Module):
    """Section 3.2.2: project Q, K, V per head (d_k for Q/K, d_v for V), attend, concatenate, project with W^O.

    Q, K and V projections live in one (H*(2*Dk + Dv), D) matrix: self-attention does one fused matmul,
    cross-attention slices the Q rows (decoder side) and the K/V rows (encoder side, once per sentence).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h = cfg.d_model, cfg.heads
        self.heads = h
        self.dk = cfg.head_dim or d // h
        self.dv = cfg.value_dim or d // h
        self.sizes = [h * self.dk, h * self.dk, h * self.dv]  # rows of W^Q, W^K, W^V in in_weight
        self.in_weight = nn.Parameter(torch.empty(sum(self.sizes), d))
        self.in_bias = nn.Parameter(torch.empty(sum(self.sizes)))
        self.out = nn.Linear(h * self.dv, d)
        self.dropout = cfg.attention_dropout

    def reset_parameters(self) -> None:
        # Each of W^Q, W^K, W^V gets its own Xavier bound, as three separate (D -> H*d) layers would.
        for block in self.in_weight.split(self.sizes):
            nn.init.xavier_uniform_(block)
        nn.init.zeros_(self.in_bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, -1).transpose(1, 2)  # (B, T, H*d) -> (B, T, H, d) -> (B, H, T, d)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention input (B, T, D) -> q, k (B, H, T, Dk), v (B, H, T, Dv) with one matmul."""
        q, k, v = F.linear(x, self.in_weight, self.in_bias).split(self.sizes, dim=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> queries (B, H, T, Dk)."""
        n = self.sizes[0]
        return self._split_heads(F.linear(x, self.in_weight[:n], self.in_bias[:n]))

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) -> keys (B, H, S, Dk), values (B, H, S, Dv)."""
        n = self.sizes[0]
        k, v = F.linear(memory, self.in_weight[n:], self.in_bias[n:]).split(self.sizes[1:], dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, *, causal: bool = False, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(q k^T / sqrt(Dk)) v over heads, then W^O: (B, H, T, Dk) x (B, H, K, Dk|Dv) -> (B, T, D).

        ``allowed``: bool, True = attend, broadcastable to (B, H, T, K); None = attend to all keys, or with
        ``causal`` (T == K) to keys at or before the query's position (no mask tensor: SDPA's ``is_causal``).
        Fast path: SDPA (a fused kernel, e.g. flash attention on CPU when there is no attention dropout).
        With ``need_weights`` the product is spelled out and the weights (B, H, T, K), taken before
        attention dropout, come back too: masked keys get -inf before the softmax, so exactly 0 after it.
        """
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) * self.dk**-0.5  # (B, H, T, K); section 3.2.1 scaling
            if causal:
                allowed = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = scores.softmax(dim=-1)
            out = dropout(weights, p, self.training) @ v  # (B, H, T, Dv)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal)  # scale 1/sqrt(Dk)
        b, h, t, dv = out.shape
        return self.out(out.transpose(1, 2).reshape(b, t, h * dv)), weights  # (B, H, T, Dv) -> (B, T, H*Dv)


class FeedForward(nn.Module):
    """Section 3.3: FFN(x) = act(x W1 + b1) W2 + b2, inner size d_ff; activation dropout after act."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = F.relu if cfg.activation == "relu" else F.gelu
        self.dropout = cfg.activation_dropout

    def forward(self, x: Tensor) -> Tensor:  # (B, T, D) -> (B, T, D)
        return self.fc2(dropout(self.act(self.fc1(x)), self.dropout, self.training))


class _Block(nn.Module):
    """Residual wiring shared by both layer kinds: post-norm LayerNorm(x + Dropout(f(x))) (sections 3.1, 5.4)
    or pre-norm x + Dropout(f(Norm(x))) (norm pre: LayerNorm; norm scale: ScaleNorm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = cfg.norm in ("pre", "scale")
        self.dropout = cfg.dropout

    def _add(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        x = x + dropout(y, self.dropout, self.training)  # P_drop on each sublayer output, before the add
        return x if self.pre else norm(x)


class EncoderLayer(_Block):
    """Self-attention, then FFN; (B, S, D) -> (B, S, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn, self.ffn = MultiHeadAttention(cfg), FeedForward(cfg)
        self.norm1, self.norm2 = _norm(cfg), _norm(cfg)

    def forward(self, x: Tensor, allowed: Tensor | None, *, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``allowed``: (B, 1, 1, S) bool, True = attend (the source key-padding mask), None without padding. Returns the layer's
        output (B, S, D) and, with ``need_weights``, its self-attention weights (B, H, S, S), else None."""
        h = self.norm1(x) if self.pre else x
        h, weights = self.self_attn.attend(*self.self_attn.project_qkv(h), allowed, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        return self._add(x, self.ffn(h), self.norm2), weights


class DecoderLayer(_Block):
    """Masked self-attention, cross-attention over the encoder output, then FFN; (B, T, D) -> (B, T, D)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.self_attn, self.cross_attn, self.ffn = MultiHeadAttention(cfg), MultiHeadAttention(cfg), FeedForward(cfg)
        self.norm1, self.norm2, self.norm3 = (_norm(cfg) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        *,
        self_allowed: Tensor | None,
        cross_allowed: Tensor | None,
        causal: bool = False,
        cache: DecoderCache | None = None,
        layer: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, LayerAttention | None]:
        """x (B, T, D); cross_k/v (B, H, S, Dk|Dv) from the encoder output; masks bool, True = attend:
        ``self_allowed`` (B, 1, T, T) causal + padding, or None with ``causal`` (causal only, right-padded x),
        ``cross_allowed`` (B, 1, 1, S), None when the source has no padding.
        With ``cache`` (incremental decoding, x holds only the new positions), this layer's self-attention
        K/V are appended to the cache and the queries see every cached position, so no mask is needed."""
        h = self.norm1(x) if self.pre else x
        q, k, v = self.self_attn.project_qkv(h)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, length + T, Dk|Dv)
        h, self_w = self.self_attn.attend(q, k, v, self_allowed, causal=causal, need_weights=need_weights)
        x = self._add(x, h, self.norm1)
        h = self.norm2(x) if self.pre else x
        if cache is not None and cache.group > 1:
            # A sentence's beams query its one copy of the encoder output as `group` query positions:
            # (R, 1, D) -> (G, group, D) -> attend -> (R, 1, D).
            h, cross_w = self.cross_attn.attend(self.cross_attn.project_q(h.reshape(-1, cache.group, h.size(-1))), cross_k, cross_v, cross_allowed)
            h = h.reshape(x.shape)
        else:
            h, cross_w = self.cross_attn.attend(self.cross_attn.project_q(h), cross_k, cross_v, cross_allowed, need_weights=need_weights)
        x = self._add(x, h, self.norm2)
        h = self.norm3(x) if self.pre else x
        x = self._add(x, self.ffn(h), self.norm3)
        return x, (LayerAttention(self_w, cross_w) if need_weights else None)


def _check(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> None:
    for key, allowed in (("norm", ("post", "pre", "scale")), ("activation", ("relu", "gelu")), ("positions", ("sinusoidal", "learned"))):
        if getattr(cfg, key) not in allowed:
            raise ConfigError(f"model.{key}={getattr(cfg, key)!r} is not one of {', '.join(allowed)}")
    if (not cfg.head_dim or not cfg.value_dim) and cfg.d_model % cfg.heads:
        raise ConfigError(
            f"model.d_model={cfg.d_model} is not divisible by model.heads={cfg.heads}; "
            "choose d_model as a multiple of heads or set model.head_dim and model.value_dim"
        )
    if cfg.share_all_embeddings and src_vocab_size != tgt_vocab_size:
        raise ConfigError(
            f"model.share_all_embeddings needs one vocabulary, but src_vocab_size={src_vocab_size} != tgt_vocab_size={tgt_vocab_size}; "
            "use a joint tokenizer (tokenizer.joint: true) or set model.share_all_embeddings: false"
        )


class Transformer(nn.Module):
    """Encoder-decoder Transformer (section 3). Token ids are padded with ``PAD_ID``; masks follow the
    module docstring (padding masks True = pad; attention masks True = attend)."""

    def __init__(self, cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        _check(cfg, src_vocab_size, tgt_vocab_size)
        d = cfg.d_model
        self.cfg = cfg
        self.embed_scale = math.sqrt(d)  # section 3.4: embeddings multiplied by sqrt(d_model)
        self.dropout = cfg.dropout
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=PAD_ID)
        # Section 3.4: one matrix for both embeddings and the pre-softmax layer (joint vocabulary); with
        # separate vocabularies only the target embedding and the output layer can share.
        self.tgt_embed = self.src_embed if cfg.share_all_embeddings else nn.Embedding(tgt_vocab_size, d, padding_idx=PAD_ID)
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)
        if cfg.share_all_embeddings or cfg.share_decoder_embeddings:
            self.output_proj.weight = self.tgt_embed.weight
        self.learned_positions = cfg.positions == "learned"
        if self.learned_positions:  # Table 3 row (E)
            self.pos_embed = nn.Embedding(cfg.max_positions, d)
        else:  # not persistent: a function of the config, recomputed (and grown) rather than checkpointed
            self.register_buffer("pe", sinusoids(cfg.max_positions, d), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm leaves the residual stream unnormalised: one final norm per stack (ScaleNorm's too).
        self.encoder_norm = _norm(cfg) if cfg.norm != "post" else None
        self.decoder_norm = _norm(cfg) if cfg.norm != "post" else None
        self.fix_norm = cfg.norm == "scale"  # FixNorm: unit-length word embeddings (module docstring)
        # The kept output pieces (K,) ascending; all V until restrict_output_to() sets them (a checkpoint's replace them
        # on load, at their size); output_index (V,) maps a full id to its kept index (UNK's for a piece not kept).
        self.tgt_vocab_size = tgt_vocab_size
        ids = torch.arange(tgt_vocab_size) if cfg.restrict_output else None
        self.register_buffer("output_ids", ids)
        self.register_buffer("output_index", None if ids is None else ids.clone(), persistent=False)
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

    def _positions(self, start: int, n: int) -> Tensor:
        """Position vectors for positions [start, start + n): (n, D)."""
        end = start + n
        if self.learned_positions:
            if end > self.cfg.max_positions:
                raise ValueError(
                    f"sequence needs {end} positions but model.max_positions={self.cfg.max_positions} (learned positions); "
                    "shorten the input (data.max_len, decode max length) or train with a larger model.max_positions"
                )
            return self.pos_embed.weight[start:end]
        if end > self.pe.size(0):  # never grown here: decoding must not change the module (threads share it)
            raise ValueError(
                f"sequence needs {end} positions but the sinusoid table holds {self.pe.size(0)}; call "
                f"model.reserve_positions({end}) before encoding or decoding (Translator and translate_ids do it for you)"
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
            self.pe = sinusoids(n, self.cfg.d_model, device=self.pe.device).to(self.pe.dtype)

    def cast_weights(self, dtype: torch.dtype) -> Transformer:
        """Inference in reduced precision (``tmt translate --dtype bfloat16/float16``): every matmul weight
        and embedding table in ``dtype``, cast once (cheaper per step than autocast); LayerNorm and ScaleNorm parameters
        and the sinusoid table stay float32 (:class:`LayerNorm` normalises in float32; the positions are
        added in float32). Returns the model."""
        for module in self.modules():
            if module is not self and not isinstance(module, (nn.LayerNorm, ScaleNorm)):  # the pe buffer is the model's own
                module._apply(lambda t: t.to(dtype) if t.is_floating_point() else t, recurse=False)
        return self

    def _embed(self, embed: nn.Embedding, tokens: Tensor, *, start: int = 0) -> Tensor:
        """(B, T) ids at positions [start, start + T) -> (B, T, D): scaled embedding + position, dropout.
        With weights cast to bf16 / fp16 the sum is taken with the float32 sinusoids, then rounded once."""
        e = embed(tokens)
        if self.fix_norm:  # FixNorm: each looked-up row to length 1 (in float32), then the sqrt(d) scale below
            e = F.normalize(e.float(), dim=-1).to(e.dtype)
        x = (e * self.embed_scale + self._positions(start, tokens.size(1))).to(e.dtype)
        return dropout(x, self.dropout, self.training)  # section 5.4: dropout on embeddings + positions

    def encode(self, src: Tensor, *, padded: bool = True) -> EncoderOut:
        """src (B, S) ids padded with PAD_ID -> EncoderOut(memory (B, S, D), src_pad (B, S) True = pad, allowed).

        ``padded=False`` states that no row of ``src`` holds padding (the trainer knows it from the collated
        lengths, without asking the device): attention over the source then runs without a key mask."""
        return self._encode(src, padded=padded)[0]

    def _encode(self, src: Tensor, *, padded: bool = True, need_weights: bool = False) -> tuple[EncoderOut, list]:
        """:meth:`encode`, plus each encoder layer's self-attention weights (B, H, S, S) if asked (else Nones)."""
        src_pad = src.eq(PAD_ID)
        allowed = _allowed(src_pad) if padded else None  # (B, 1, 1, S)
        x = self._embed(self.src_embed, src)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, allowed, need_weights=need_weights)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOut(x, src_pad, allowed), weights

    def decode(self, tgt_in: Tensor, enc: EncoderOut, *, keep: Tensor | None = None) -> Tensor:
        """Teacher forcing: tgt_in (B, T) = BOS + target, right-padded with PAD_ID -> logits (B, T, V_tgt).

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
        (``need_weights``): the product is spelled out instead of SDPA's fused kernel, which every other
        entry point keeps using. Call it in eval mode (no dropout) to see the weights decoding uses; to see
        them for a translation, pass BOS + its tokens as ``tgt_in``.
        """
        enc, encoder = self._encode(src, need_weights=True)
        x, decoder = self._decoder_states(tgt_in, enc, need_weights=True)
        return AttentionWeights(tuple(encoder), tuple(w.self_attn for w in decoder), tuple(w.cross_attn for w in decoder), self.logits(x))

    def _decoder_states(self, tgt_in: Tensor, enc: EncoderOut, *, need_weights: bool = False) -> tuple[Tensor, list]:
        """tgt_in (B, T) -> the top decoder states (B, T, D) (after the final norm), and attention weights if asked.

        Self-attention is causal only (SDPA's ``is_causal``, no mask tensor; see the module docstring) unless the
        weights are asked for: those are exactly 0 on padding keys too, so they get the full mask."""
        self_allowed = _allowed(tgt_in.eq(PAD_ID), causal=True) if need_weights else None  # (B, 1, T, T)
        x = self._embed(self.tgt_embed, tgt_in)
        weights = []
        for layer in self.decoder:
            k, v = layer.cross_attn.project_kv(enc.memory)
            x, w = layer(x, k, v, self_allowed=self_allowed, causal=self_allowed is None, cross_allowed=enc.allowed, need_weights=need_weights)
            weights.append(w)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x, weights

    def decoder_output(self, tgt_in: Tensor, enc: EncoderOut) -> Tensor:
        """Teacher forcing up to the vocabulary projection: tgt_in (B, T) -> the top decoder states (B, T, D)
        (after the final norm). :class:`~transformer_mt.model.loss.TeacherForcedLoss` fuses the projection
        (:meth:`output_weight`) with the loss, so the (N, V) logits are never built in one piece."""
        return self._decoder_states(tgt_in, enc)[0]

    def forward(self, src: Tensor, tgt_in: Tensor, *, keep: Tensor | None = None) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V_tgt), or (N, V_tgt) for the positions where ``keep`` is True.

        The training loss is :class:`~transformer_mt.model.loss.TeacherForcedLoss`, a module around this model.
        """
        return self.decode(tgt_in, self.encode(src), keep=keep)

    # ------------------------------------------------------------ the output layer (FixNorm, restrict_output)
    def restrict_output_to(self, ids: Tensor) -> None:
        """Score only the target pieces ``ids`` (any order, repeats allowed; e.g. every target id of the training
        data) and PAD, UNK, BOS, EOS, which are always kept (with ids ascending they keep their index, so the loss's
        ignore_index PAD and search's PAD/BOS masking need no mapping). Needs ``model.restrict_output``."""
        if self.output_ids is None:
            raise ValueError("restrict_output_to() needs a model built with model.restrict_output: true")
        specials = torch.arange(EOS_ID + 1)  # PAD, UNK, BOS, EOS = 0..3
        kept = torch.unique(torch.cat([specials, ids.detach().long().flatten().cpu()]))  # (K,) ascending
        if kept[-1] >= self.tgt_vocab_size:
            raise ValueError(f"target id {int(kept[-1])} is outside the target vocabulary of {self.tgt_vocab_size}")
        self.output_ids = kept.to(self.output_ids.device)
        self._index_outputs()

    def _index_outputs(self) -> None:
        index = torch.full((self.tgt_vocab_size,), UNK_ID, dtype=torch.long, device=self.output_ids.device)  # (V,)
        self.output_index = index.index_copy_(0, self.output_ids, torch.arange(self.output_ids.numel(), device=index.device))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # noqa: ANN001 - torch's hook signature
        # A restricted model's kept set has the checkpoint's size K, unknown when the model is built: take it.
        ids = state_dict.get(prefix + "output_ids")
        if self.output_ids is not None and ids is not None and ids.shape != self.output_ids.shape:
            self.output_ids = torch.empty_like(ids, device=self.output_ids.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.output_ids is not None:
            self._index_outputs()

    @property
    def output_size(self) -> int:
        """Rows of the output layer's matmul: K kept pieces with ``model.restrict_output``, else V (FLOP counts)."""
        return self.tgt_vocab_size if self.output_ids is None else self.output_ids.numel()

    def output_weight(self) -> Tensor:
        """The output layer's (K or V, D) matrix as the model scores with it: the kept rows of ``output_proj`` (all V
        rows without ``restrict_output``), l2-normalised under FixNorm. The training loss projects with it."""
        w = self.output_proj.weight
        if self.output_ids is not None:
            w = w.index_select(0, self.output_ids)  # (V, D) -> (K, D); backward scatters into the (tied) matrix
        return F.normalize(w, dim=-1) if self.fix_norm else w

    def output_targets(self, target: Tensor) -> Tensor:
        """Target ids (...) -> their rows of :meth:`output_weight`: the kept index with ``restrict_output`` (a piece
        not kept, e.g. in a validation set, is scored as UNK, the piece the model emits for what it cannot spell);
        the ids themselves without."""
        return target if self.output_index is None else self.output_index[target]

    def logits(self, x: Tensor) -> Tensor:
        """Top decoder states (..., D) -> logits over the full target vocabulary (..., V); with ``restrict_output``
        the pieces not kept get -inf (the matmul runs over the K kept rows, then one scatter)."""
        if self.output_ids is None and not self.fix_norm:
            return self.output_proj(x)  # the module call: forward hooks (tmt inspect) see the output layer
        logits = F.linear(x, self.output_weight())  # (..., K)
        if self.output_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.tgt_vocab_size), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.output_ids, logits)

    def max_output_length(self) -> int | None:
        """Longest output the decoder can produce: BOS plus the first L-1 outputs occupy positions
        0..L-1 of a learned position table; None for sinusoids, which extend to any length."""
        return self.cfg.max_positions if self.learned_positions else None

    def init_cache(self, enc: EncoderOut) -> DecoderCache:
        """Start incremental decoding of a batch: project the encoder output to every layer's cross K/V once."""
        ks, vs = zip(*(layer.cross_attn.project_kv(enc.memory) for layer in self.decoder))
        return DecoderCache(torch.stack(ks), torch.stack(vs), enc.src_pad, enc.allowed)  # (L, B, H, S, Dk|Dv)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens (B,): the newest token of each row (BOS first), at position ``cache.length``
        -> logits (B, V_tgt) for the next token. Only the new position is computed; its self-attention
        K/V are appended to ``cache``, which then advances by one."""
        x = self._embed(self.tgt_embed, tokens[:, None], start=cache.length)  # (B,) -> (B, 1, D)
        for i, layer in enumerate(self.decoder):
            # A single query attends to every cached position, all of them in its past: no mask.
            x, _ = layer(x, cache.cross_k[i], cache.cross_v[i], self_allowed=None, cross_allowed=cache.cross_allowed, cache=cache, layer=i)
        cache.length += 1
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.logits(x[:, 0])  # (B, 1, D) -> (B, V)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars, a shared (tied) matrix counted once: ``parameters()`` yields each
    Parameter object once."""
    return sum(p.numel() for p in model.parameters())
