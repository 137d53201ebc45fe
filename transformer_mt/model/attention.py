"""Multi-head attention (section 3.2) and the attention masks.

Shapes: B batch, T query positions, K key positions (S for the source), D d_model, H heads, Dk query/key
size per head, Dv value size per head.

Mask convention (one for the whole model):
  * padding masks (``src_pad``, ``tgt_pad``) are bool, **True = padding position**; they are what
    callers see (``EncoderOut.src_pad``, ``DecoderCache.src_pad``), built from the model's pad id.
  * attention masks (``allowed``) are bool, **True = this query may attend to this key**, the convention
    of ``F.scaled_dot_product_attention``; they broadcast as (B, 1, 1, S) for key padding or
    (B, 1, T, T) for causal + key padding, and are built only by :func:`allowed_mask` from padding masks.
    :func:`allowed_mask` never leaves a query row with no key (an all-pad row would softmax to NaN, and
    NaN values leak through later layers even under zero weights): such a row may attend everywhere.
  * no mask at all where none is needed, so that SDPA may pick its fastest kernel (flash attention takes
    ``is_causal`` but no explicit mask on GPUs): the teacher-forced decoder's self-attention is causal
    only (``is_causal=True``): ``tgt_in`` is right-padded (start + target, ``data.collate``), so a real
    position's past holds no padding, and padded positions, whose outputs nothing reads, may see padding;
    a source without padding (``encode(src, padded=False)``, stated by a caller that knows it from the
    collated lengths) gets no key mask. Both give the masked path's numbers bit for bit on CPU (tests).
  * packed sentences (training without padding: the sentences of a batch end to end in one (1, N, D) row, their
    lengths in :class:`Segments`) take a :class:`BlockDiagonal` in place of the mask tensor: True = the query's
    sentence's keys (and with ``causal`` those at or before its position), computed by ``ops.varlen_attention``
    without building the (N, N) mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from transformer_mt.config import ModelConfig
from transformer_mt.model.linear import Linear
from transformer_mt.model.ops import Ops, choose_ops


class Segments(NamedTuple):
    """Sentences packed end to end in one row of N tokens (flash attention's varlen layout)."""

    cu_seqlens: Tensor  # (B + 1,) int32, from 0: sentence b holds tokens [cu_seqlens[b], cu_seqlens[b + 1])
    max_len: int  # the longest sentence's length (a host int: kernels size their grids by it)
    positions: Tensor  # (N,) long, each token's position in its sentence (0 at each sentence's first)


class BlockDiagonal(NamedTuple):
    """The attention mask of packed sentences: query sentence b may attend to key sentence b only (True = attend
    within a diagonal block), with ``causal`` only to keys at or before its position. Never built as a tensor."""

    q: Segments  # the queries' sentences
    k: Segments  # the keys': the same sentences in the same order (the source's, in cross-attention)


AttentionMask = Tensor | BlockDiagonal | None  # what a layer hands its attention: a bool mask, packed segments, none


def allowed_mask(pad: Tensor, *, causal: bool = False) -> Tensor:
    """Padding mask (B, K) True = pad -> attention mask True = attend: (B, 1, 1, K), or (B, 1, K, K) if causal."""
    allowed = ~pad[:, None, None, :]  # (B, K) -> (B, 1, 1, K)
    if causal:  # section 3.2.3: position i sees positions <= i
        allowed = allowed & torch.ones(pad.size(1), pad.size(1), dtype=torch.bool, device=pad.device).tril()
    # A row with no allowed key (all-pad sentence, or a left-pad query) attends everywhere instead of giving NaN.
    return allowed | ~allowed.any(-1, keepdim=True)


class MultiHeadAttention(nn.Module):
    """Section 3.2.2: project Q, K, V per head (d_k for Q/K, d_v for V), attend, concatenate, project with W^O.

    Q, K and V projections live in one (H*(2*Dk + Dv), D) matrix: self-attention does one fused matmul,
    cross-attention slices the Q rows (decoder side) and the K/V rows (encoder side, once per sentence).
    The products and the attention itself are computed by ``ops``, the model's backend (None: the CPU's ``auto``).
    """

    def __init__(self, cfg: ModelConfig, *, ops: Ops | None = None):
        super().__init__()
        self.ops = ops if ops is not None else choose_ops()
        d, h = cfg.d_model, cfg.heads
        self.heads = h
        self.dk = cfg.head_dim or d // h
        self.dv = cfg.value_dim or d // h
        self.sizes = [h * self.dk, h * self.dk, h * self.dv]  # rows of W^Q, W^K, W^V in in_weight
        self.in_weight = nn.Parameter(torch.empty(sum(self.sizes), d))
        self.in_bias = nn.Parameter(torch.empty(sum(self.sizes)))
        self.out = Linear(h * self.dv, d, ops=self.ops)
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
        q, k, v = self.ops.linear(x, self.in_weight, self.in_bias).split(self.sizes, dim=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> queries (B, H, T, Dk)."""
        n = self.sizes[0]
        return self._split_heads(self.ops.linear(x, self.in_weight[:n], self.in_bias[:n]))

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) -> keys (B, H, S, Dk), values (B, H, S, Dv)."""
        n = self.sizes[0]
        k, v = self.ops.linear(memory, self.in_weight[n:], self.in_bias[n:]).split(self.sizes[1:], dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: AttentionMask,
        *,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(q k^T / sqrt(Dk)) v over heads (section 3.2.1), then W^O: (B, H, T, Dk) x (B, H, K, Dk|Dv)
        -> (B, T, D).

        ``allowed``: bool, True = attend, broadcastable to (B, H, T, K); None = attend to all keys, or with
        ``causal`` (T == K) to keys at or before the query's position (no mask tensor: SDPA's ``is_causal``).
        With ``need_weights`` the weights (B, H, T, K), taken before attention dropout, come back too (exactly 0 on
        blocked keys); else None. Which kernel computes it is the backend's choice (``ops.attention``).
        A :class:`BlockDiagonal`: q, k, v are packed sentences, B = 1, T and K their token counts
        (``ops.varlen_attention``); no weights.
        """
        if isinstance(allowed, BlockDiagonal):
            if need_weights:
                raise ValueError("packed sentences give no attention weights; ask with a padded batch")
            return self.out(self._attend_packed(q, k, v, allowed, causal=causal)), None
        out, weights = self.ops.attention(
            q, k, v, allowed, causal=causal, dropout_p=self._dropout_p(), need_weights=need_weights
        )
        return self.out(out), weights  # (B, T, H*Dv) -> (B, T, D)

    def _attend_packed(self, q: Tensor, k: Tensor, v: Tensor, blocks: BlockDiagonal, *, causal: bool) -> Tensor:
        """Packed sentences: q (1, H, Nq, Dk), k (1, H, Nk, Dk), v (1, H, Nk, Dv) -> (1, Nq, H*Dv)."""
        q, k, v = (x[0].transpose(0, 1) for x in (q, k, v))  # (1, H, N, d) -> (N, H, d), views
        out = self.ops.varlen_attention(
            q,
            k,
            v,
            blocks.q.cu_seqlens,
            blocks.k.cu_seqlens,
            blocks.q.max_len,
            blocks.k.max_len,
            causal=causal,
            dropout_p=self._dropout_p(),
        )  # (Nq, H, Dv)
        return out.reshape(1, out.size(0), -1)  # (Nq, H, Dv) -> (1, Nq, H*Dv)

    def attend_cache(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None) -> Tensor:
        """:meth:`attend` for one decoding step over the decoder's cache: q (R, H, 1, Dk), k (R, H, T, Dk), v (R, H, T,
        Dv) -> (R, 1, D). ``allowed`` None: no mask (every position of a growing cache is in the query's past); a
        static cache's (1, 1, 1, T) True = attend marks its filled prefix."""
        step = self.ops.self_attention_step(q, k, v, dropout_p=self._dropout_p(), allowed=allowed)  # (R, 1, H*Dv)
        return self.out(step)  # (R, 1, H*Dv) -> (R, 1, D)

    def attend_source(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
        """:meth:`attend` for one decoding step over the source, a sentence's beams as its query positions:
        q (G, H, group, Dk), k (G, H, S, Dk), v (G, H, S, Dv), ``allowed`` (G, 1, 1, S) or None -> (G, group, D)."""
        return self.out(self.ops.cross_attention_step(q, k, v, allowed, dropout_p=self._dropout_p()))

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0  # attention dropout, in training only
