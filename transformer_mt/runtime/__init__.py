"""The process: device, threads, seeding, autocast, torchrun collectives, FLOPs and the matmul peak."""

from transformer_mt.runtime.flops import forward_flops
from transformer_mt.runtime.syncs import SyncCounter, per_call

__all__ = ["SyncCounter", "forward_flops", "per_call"]
