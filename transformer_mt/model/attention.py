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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer_mt.config import ModelConfig
from transformer_mt.model import native
from transformer_mt.model.kernels import Linear, dropout, linear, reference_ops


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
        self.out = Linear(h * self.dv, d)
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
        q, k, v = linear(x, self.in_weight, self.in_bias).split(self.sizes, dim=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_q(self, x: Tensor) -> Tensor:
        """Decoder states (B, T, D) -> queries (B, H, T, Dk)."""
        n = self.sizes[0]
        return self._split_heads(linear(x, self.in_weight[:n], self.in_bias[:n]))

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) -> keys (B, H, S, Dk), values (B, H, S, Dv)."""
        n = self.sizes[0]
        k, v = linear(memory, self.in_weight[n:], self.in_bias[n:]).split(self.sizes[1:], dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None,
        *,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(q k^T / sqrt(Dk)) v over heads, then W^O: (B, H, T, Dk) x (B, H, K, Dk|Dv) -> (B, T, D).

        ``allowed``: bool, True = attend, broadcastable to (B, H, T, K); None = attend to all keys, or with
        ``causal`` (T == K) to keys at or before the query's position (no mask tensor: SDPA's ``is_causal``).
        Fast path: SDPA (a fused kernel, e.g. flash attention on CPU when there is no attention dropout); a
        training step on CPU over at most SHORT_KEYS keys spells the product out instead (faster there). With
        ``need_weights`` the product is spelled out and the weights (B, H, T, K), taken before attention
        dropout, come back too: masked keys get -inf before the softmax, so exactly 0 after it.
        """
        p = self.dropout if self.training else 0.0
        if not need_weights and p == 0.0 and _native_applies(q, k, v, allowed):
            b, _, t, _ = q.shape
            keys = None if allowed is None else allowed.reshape(b, -1)  # (B, 1, 1, K) -> (B, K)
            out = native.short_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keys, causal=causal, scale=self.dk**-0.5
            )
            return self.out(out), None  # (B, T, H*Dv) already
        if need_weights or _spelled_out_is_faster(k):
            scores = q @ k.transpose(-2, -1) * self.dk**-0.5  # (B, H, T, K); section 3.2.1 scaling
            if causal:
                allowed = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = scores.softmax(dim=-1)
            out = dropout(weights, p, self.training) @ v  # (B, H, T, Dv)
        else:
            weights = None
            if q.device.type == "cuda" and CUDA_SDPA_BACKENDS:
                with sdpa_kernel(CUDA_SDPA_BACKENDS):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal)
            else:
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=allowed, dropout_p=p, is_causal=causal
                )  # scale 1/sqrt(Dk)
        b, h, t, dv = out.shape
        return self.out(
            out.transpose(1, 2).reshape(b, t, h * dv)
        ), weights if need_weights else None  # (B, H, T, Dv) -> (B, T, H*Dv)


# The SDPA kernels allowed on a GPU: not cuDNN's, which torch prefers for bfloat16 / float16 on recent GPUs. cuDNN
# builds an execution plan for every new (batch, query length, key length) shape; token-bucketed batches and a
# search's growing prefix bring a new shape with nearly every batch and step, so the plans would cost more than the
# attention. Flash and memory-efficient attention need no plan. An empty list lets torch choose.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# SDPA's CPU flash kernel works in blocks sized for long sequences; below this many keys, the product spelled out
# as two batched matmuls and a softmax is faster forward and backward (docs/benchmarks.md, the attention row).
SHORT_KEYS = 64


def _native_applies(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> bool:
    """Whether a training step's attention goes through the C++ kernel of :mod:`transformer_mt.model.native`: over few
    keys on CPU in float32 (as :func:`_spelled_out_is_faster`), head sizes multiples of 16, a key-padding mask or none,
    and the kernel built (the first call builds it)."""
    return (
        _spelled_out_is_faster(k)
        and q.dtype == k.dtype == v.dtype == torch.float32
        and q.size(-1) % 16 == 0
        and v.size(-1) % 16 == 0
        and (allowed is None or (allowed.dim() == 4 and allowed.size(1) == 1 and allowed.size(2) == 1))
        and native.available()
    )


def _spelled_out_is_faster(k: Tensor) -> bool:
    """Whether a training step on CPU attends over few enough keys (k: (B, H, K, Dk)) for the spelled-out product
    (not under ``use_reference_ops(True)``, whose plain path is SDPA everywhere)."""
    return k.device.type == "cpu" and k.size(2) <= SHORT_KEYS and torch.is_grad_enabled() and not reference_ops()
