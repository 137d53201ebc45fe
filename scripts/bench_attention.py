#!/usr/bin/env python
"""Attention on CPU, forward + backward: SDPA's kernel against the product spelled out as batched matmuls.

    python scripts/bench_attention.py [--threads 2] [--reps 30] [--batch-tokens 4096]

Runs :meth:`transformer_mt.model.MultiHeadAttention.attend` itself, once through each path (the choice that the cpu
backend, ``CpuOps.spelled_out_is_faster``, makes by the number of keys, forced either way; the spelled-out path is the
C++ kernel where it is built), on random q, k, v with the masks a training step uses: the encoder's key-padding mask,
the decoder's causal self-attention, cross-attention with key padding. First the recipe's shapes (about 15-piece
sentences, 4 heads, d_k 32), then key lengths from 16 to 128 at d_k 32 and 64 with as many sentences as fill
``--batch-tokens``. Prints milliseconds per call (best of 3 rounds) and the ratio; the crossover is where
``SHORT_KEYS`` (``transformer_mt/model/ops/cpu/attention.py``) belongs. Time it with nothing else running.
"""

from __future__ import annotations

import argparse
import time

import torch

from transformer_mt.config import ModelConfig
from transformer_mt.model import MultiHeadAttention, allowed_mask
from transformer_mt.model.ops.cpu import CpuOps


class ForcedPath(CpuOps):
    """The cpu backend with its attention path forced: spelled out (True) or SDPA (False), whatever the keys."""

    def __init__(self, spelled: bool):
        self.spelled = spelled

    def spelled_out_is_faster(self, k: torch.Tensor) -> bool:  # noqa: ARG002 - the key count is what it overrides
        return self.spelled


def time_call(fn, *, reps: int) -> float:
    """Milliseconds per forward + backward call, best of 3 rounds of ``reps`` after 5 warm-up calls."""
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(3):
        tic = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - tic) / reps * 1e3)
    return best


def case(
    attn: MultiHeadAttention, *, batch: int, queries: int, keys: int, causal: bool, padded: bool, reps: int
) -> dict[str, float]:
    """Both paths on one shape: q (B, H, T, Dk), k and v (B, H, K, Dk); returns ms per call and the
    largest output difference."""
    g = torch.Generator().manual_seed(0)
    h, dk = attn.heads, attn.dk
    q, k, v = (torch.randn(batch, h, n, dk, generator=g).requires_grad_() for n in (queries, keys, keys))
    allowed = None
    if padded:  # sentences of 70-100% of the longest, as a length-sorted token batch holds them
        lengths = torch.randint(int(0.7 * keys), keys + 1, (batch,), generator=g)
        lengths[0] = keys
        allowed = allowed_mask(torch.arange(keys)[None] >= lengths[:, None])

    def step(spelled: bool):
        forced = ForcedPath(spelled)

        def run() -> torch.Tensor:
            ops, attn.ops = attn.ops, forced  # the attention's path only; W^O keeps the module's backend
            try:
                out, _ = attn.attend(q, k, v, allowed, causal=causal)
            finally:
                attn.ops = ops
            out.backward(torch.ones_like(out))
            return out

        return run

    diff = float((step(True)() - step(False)()).detach().abs().max())
    return {"sdpa": time_call(step(False), reps=reps), "spelled": time_call(step(True), reps=reps), "diff": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--batch-tokens", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; ms per forward + backward call, best of 3 x {args.reps}")
    print(
        "\n| shape | SDPA ms | spelled out ms | SDPA / spelled | max difference |\n| --- | ---: | ---: | ---: | ---: |"
    )
    recipe = MultiHeadAttention(ModelConfig(d_model=128, heads=4))
    rows = [
        (
            "recipe encoder self-attention (240 x 17 keys, padding mask)",
            dict(queries=17, keys=17, causal=False, padded=True),
        ),
        ("recipe decoder self-attention (240 x 18, causal)", dict(queries=18, keys=18, causal=True, padded=False)),
        (
            "recipe cross-attention (240 x 18 queries x 17 keys, padding mask)",
            dict(queries=18, keys=17, causal=False, padded=True),
        ),
    ]
    for name, shape in rows:
        r = case(recipe, batch=240, reps=args.reps, **shape)
        print(f"| {name} | {r['sdpa']:.2f} | {r['spelled']:.2f} | {r['sdpa'] / r['spelled']:.2f} | {r['diff']:.1e} |")
    for dk in (32, 64):
        attn = MultiHeadAttention(ModelConfig(d_model=4 * dk, heads=4))
        for keys in (16, 32, 64, 96, 128):
            for causal in (False, True):
                batch = max(1, args.batch_tokens // keys)
                r = case(
                    attn, batch=batch, queries=keys, keys=keys, causal=causal, padded=False, reps=max(5, args.reps // 3)
                )
                kind = "causal" if causal else "no mask"
                print(
                    f"| d_k {dk}, {batch} x {keys} keys, {kind} | {r['sdpa']:.2f} | {r['spelled']:.2f} "
                    f"| {r['sdpa'] / r['spelled']:.2f} | {r['diff']:.1e} |"
                )


if __name__ == "__main__":
    main()
