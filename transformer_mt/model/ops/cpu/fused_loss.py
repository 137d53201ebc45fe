"""The vocabulary projection fused with the label-smoothed loss, in row chunks, so that the (N, V) logits and their
gradient never exist in one piece: :func:`projected_sums`, the CPU backend's ``projected_loss`` (and, until the GPU
work brings its own, the CUDA backend's).

Two forms: :class:`_ProjectedLabelSmoothedLoss` keeps each chunk's softmax for the backward (any device and dtype,
and validation); in a float32 training step on CPU with the C++ kernels built, :class:`_LossSumAndGradient` takes the
gradient in the forward, chunk by chunk. The products go through oneDNN on CPU
(:mod:`~transformer_mt.model.ops.cpu.onednn`), the softmax passes through C++
(:mod:`~transformer_mt.model.ops.cpu.native`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.model.ops.cpu import native
from transformer_mt.model.ops.cpu.onednn import onednn_applies, times_transposed

# Rows of the (N, V) logits handled at once by the fused loss. On CPU, chunks of at most 16 MiB of
# float32 stay below glibc's largest mmap threshold (32 MiB), so after the first step their memory comes
# back from the heap instead of fresh pages (first-touch page faults can cost as much as the softmax
# itself). On a GPU the chunks only bound the transient buffers (each
# chunk's softmax is kept for backward either way) while every chunk costs a dozen kernel launches:
# with a 37k vocabulary 16 MiB would mean ~113 rows and ~220 chunks per 25k-token batch, 1 GiB ~30.
_CHUNK_BYTES = 16 * 2**20
_CHUNK_BYTES_GPU = 2**30


def chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows of (N, vocab) float32 logits per chunk of the fused loss on ``device`` (see _CHUNK_BYTES)."""
    return max(1, (_CHUNK_BYTES if device.type == "cpu" else _CHUNK_BYTES_GPU) // (4 * vocab))


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Per-row label-smoothed loss and NLL of ``h @ weight.T``, fused with the vocabulary projection.

    Forward keeps each chunk's softmax (float32, in the chunk's logits buffer); backward turns it in
    place into d loss / d logits = w * (softmax - q), q the smoothed target distribution, and
    multiplies back through the projection. Compared with ``log_softmax`` + ``gather`` + ``sum``
    under autograd this makes two passes over the (N, V) tensor instead of about eight, and never
    allocates the (N, V) logits or their gradient in one piece.
    """

    @staticmethod
    def forward(
        ctx, h: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int, compute_dtype: torch.dtype
    ):
        vocab = weight.size(0)
        rows = chunk_rows(vocab, h.device)
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        pad = target == ignore_index
        safe = target.masked_fill(pad, 0)
        w = weight.to(compute_dtype)
        probs, lse_parts, tgt_parts, sum_parts = [], [], [], []
        in_cpp = _softmax_rows_in_cpp(h, compute_dtype)
        for start in range(0, h.size(0), rows):
            x = times_transposed(h[start : start + rows].to(compute_dtype), w)  # (n, V) logits
            if in_cpp:  # the same softmax and sums, each row read from memory once
                lse_part, tgt_part, sum_part = torch.ops.tmt.softmax_rows_(x, safe[start : start + rows])
                lse_parts.append(lse_part)
                tgt_parts.append(tgt_part)
                sum_parts.append(sum_part)
                probs.append(x)
                continue
            x = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 / fp16: the softmax in float32
            tgt_parts.append(x.gather(1, safe[start : start + rows, None]).squeeze(1))
            if epsilon > 0:
                sum_parts.append(x.sum(1))
            m = x.amax(1, keepdim=True)
            x.sub_(m).exp_()
            z = x.sum(1, keepdim=True)
            x.div_(z)  # softmax, kept for backward
            lse_parts.append((m + z.log()).squeeze(1))
            probs.append(x)
        lse = torch.cat(lse_parts)
        nll = (lse - torch.cat(tgt_parts)).masked_fill_(pad, 0.0)
        if epsilon > 0:
            smooth = (vocab * lse - torch.cat(sum_parts)).masked_fill_(pad, 0.0)  # sum over v of -log p(v)
            loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        else:
            loss = nll.clone()
        ctx.save_for_backward(h, weight, safe, pad)
        ctx.probs, ctx.rows, ctx.eps, ctx.eps_i, ctx.compute_dtype, ctx.in_cpp = (
            probs,
            rows,
            epsilon,
            eps_i,
            compute_dtype,
            in_cpp,
        )
        ctx.w = (
            w if w is not weight else None
        )  # under bf16 autocast: the cast (V, D) matrix, kept rather than cast again
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: ARG004 - grad_nll: nll is not differentiable
        h, weight, safe, pad = ctx.saved_tensors
        if ctx.probs is None:
            raise RuntimeError("projected_label_smoothed_loss: backward called twice (its buffers are reused in place)")
        probs, ctx.probs = ctx.probs, None
        cdt = ctx.compute_dtype
        w, ctx.w = (ctx.w if ctx.w is not None else weight.to(cdt)), None
        row_w = grad_loss.to(probs[0].dtype).masked_fill(pad, 0.0) if probs else grad_loss
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if ctx.needs_input_grad[0] else None
        w_dtype = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.empty(weight.shape, dtype=w_dtype, device=weight.device) if ctx.needs_input_grad[1] else None
        on_target = -(1.0 - ctx.eps - ctx.eps_i)
        for i, g in enumerate(probs):  # g: softmax of chunk i -> gradient of its logits, in place
            sl = slice(i * ctx.rows, i * ctx.rows + g.size(0))
            if ctx.in_cpp:  # the same three steps in one pass
                torch.ops.tmt.softmax_rows_backward_(g, safe[sl], row_w[sl].contiguous(), ctx.eps_i, on_target)
            else:
                if ctx.eps_i:
                    g.sub_(ctx.eps_i)
                g.scatter_add_(1, safe[sl, None], g.new_full((g.size(0), 1), on_target))
                g.mul_(row_w[sl, None])
            g = g.to(cdt)
            # torch's products are written in place (out= / addmm_): no (V, D) temporary, no add pass after. oneDNN's
            # (float32 on CPU) returns the small (n, D) input gradient, copied into place.
            if grad_h is not None:
                if grad_h.dtype == cdt and not onednn_applies(g, w):
                    torch.mm(g, w, out=grad_h[sl])
                else:
                    grad_h[sl] = times_transposed(g, w.t())
            if grad_w is not None:
                hs = h[sl].to(cdt)
                if w_dtype != cdt:  # bf16 / fp16 products, accumulated in float32
                    part = g.t() @ hs
                    if i:
                        grad_w.add_(part)
                    else:
                        grad_w.copy_(part)
                elif i:
                    grad_w.addmm_(g.t(), hs)
                else:
                    torch.mm(g.t(), hs, out=grad_w)
        if grad_w is not None and not probs:  # no rows at all: the projection gets no gradient
            grad_w.zero_()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


class _LossSumAndGradient(torch.autograd.Function):
    """:class:`_ProjectedLabelSmoothedLoss` summed over the rows, with its gradient taken in the forward: a float32
    training step on CPU (the C++ kernels built).

    The loss's gradient with respect to h and weight is the upstream gradient (one number: the loss is a sum) times
    the gradient of the sum, which needs nothing from the backward. So each chunk's logits become their gradient in
    the softmax's last pass (``softmax_rows_grad_``) and go through the two products at once, while the chunk is still
    in cache; one chunk buffer at a time is alive instead of all of them, and the Function keeps the (N, D) and (V, D)
    gradients instead of the (N, V) softmax. Backward only scales them.
    """

    @staticmethod
    def forward(
        ctx, h: Tensor, weight: Tensor, target: Tensor, epsilon: float, ignore_index: int
    ):  # autograd's signature: ctx untyped
        vocab = weight.size(0)
        rows = chunk_rows(vocab, h.device)
        eps_i = epsilon / (vocab - 1) if epsilon > 0 else 0.0
        on_target = -(1.0 - epsilon - eps_i)
        pad = target == ignore_index
        safe = target.masked_fill(pad, 0)
        row_w = (~pad).to(torch.float32)  # pad rows: no loss, no gradient
        grad_h = torch.empty_like(h)
        grad_w_t = None  # (D, V): the weight's gradient, transposed
        lse_parts, tgt_parts, sum_parts = [], [], []
        for start in range(0, h.size(0), rows):
            sl = slice(start, start + rows)
            g = times_transposed(h[sl], weight)  # (n, V) logits, then their gradient in place
            lse_part, tgt_part, sum_part = torch.ops.tmt.softmax_rows_grad_(g, safe[sl], row_w[sl], eps_i, on_target)
            lse_parts.append(lse_part)
            tgt_parts.append(tgt_part)
            sum_parts.append(sum_part)
            grad_h[sl] = times_transposed(g, weight.t())
            # h^T g through oneDNN, which takes g^T as a transposed matrix where MKL's g^T h copies both into its
            # panels first (the faster of the two here, by about a seventh)
            part = times_transposed(h[sl].t().contiguous(), g.t())
            grad_w_t = part if grad_w_t is None else grad_w_t.add_(part)
        grad_w = weight.new_zeros(weight.shape) if grad_w_t is None else grad_w_t.t().contiguous()
        if not lse_parts:  # no rows at all: no loss, no gradient
            ctx.save_for_backward(grad_h, grad_w)
            nll_sum = h.new_zeros(())
            ctx.mark_non_differentiable(nll_sum)
            return h.new_zeros(()), nll_sum
        lse = torch.cat(lse_parts)
        nll = (lse - torch.cat(tgt_parts)).masked_fill_(pad, 0.0)
        if epsilon > 0:
            smooth = (vocab * lse - torch.cat(sum_parts)).masked_fill_(pad, 0.0)
            loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        else:
            loss = nll.clone()
        ctx.save_for_backward(grad_h, grad_w)
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss.sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):  # noqa: ARG004 - grad_nll: nll is not differentiable
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None, None


def _gradient_in_forward(h: Tensor, weight: Tensor, compute_dtype: torch.dtype) -> bool:
    """Whether the fused loss takes its gradient in the forward (:class:`_LossSumAndGradient`): a float32 step on CPU
    that will run a backward (grad mode on, h or weight requiring grad), with the C++ kernels."""
    return (
        torch.is_grad_enabled()
        and (h.requires_grad or weight.requires_grad)
        and h.dtype == weight.dtype == torch.float32
        and _softmax_rows_in_cpp(h, compute_dtype)
    )


def _softmax_rows_in_cpp(h: Tensor, compute_dtype: torch.dtype) -> bool:
    """Whether the fused loss's softmax passes run in C++ (:mod:`~transformer_mt.model.ops.cpu.native`): float32 on
    CPU, the kernels built."""
    return h.device.type == "cpu" and compute_dtype == torch.float32 and native.available()


def projected_sums(
    h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, bias: Tensor | None, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """``Ops.projected_loss`` fused: the label-smoothed loss of ``h @ weight.T + bias`` (h (N, D), weight (V, D), bias
    (V,) or None, target (N,)) -> (loss_sum, nll_sum), without a host sync; ``epsilon`` checked by the caller."""
    if bias is not None:
        # The bias as one more input feature: h @ W.T + b = [h, 1] @ [W, b].T, so the fused kernel needs no bias
        # of its own, and autograd carries the bias's gradient back through the concatenation.
        h = torch.cat([h, h.new_ones(h.size(0), 1)], dim=1)  # (N, D) -> (N, D + 1)
        weight = torch.cat([weight, bias.to(weight.dtype)[:, None]], dim=1)  # (V, D) -> (V, D + 1)
    return fused_projected_label_smoothed_loss(h, weight, target, epsilon=epsilon, ignore_index=ignore_index)


def fused_projected_label_smoothed_loss(
    h: Tensor, weight: Tensor, target: Tensor, *, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """The chunked loss without a bias: h (N, D), weight (V, D), target (N,) -> (loss_sum, nll_sum), without a host
    sync. Under autocast the projection runs in the autocast dtype, the softmax in float32."""
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    with torch.autocast(kind, enabled=False):
        if _gradient_in_forward(h, weight, dtype):
            return _LossSumAndGradient.apply(h, weight, target, float(epsilon), ignore_index)
        loss, nll = _ProjectedLabelSmoothedLoss.apply(h, weight, target, float(epsilon), ignore_index, dtype)
    return loss.sum(), nll.sum()
