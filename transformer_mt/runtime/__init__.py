"""The process: device, threads, seeding, dtype and autocast; the C allocator's reuse of freed memory; the
environment defaults a command sets when it starts (torch-free, in ``transformer_mt.environment``); torchrun, DDP
and collectives; FLOPs and the matmul peak; host-device sync counting.

Callers use the package: ``from transformer_mt import runtime`` then ``runtime.pick_device(...)``,
``runtime.on_main(...)``, or import the names they need.
"""

from transformer_mt.environment import ONEDNN_CACHE_ENTRIES, put_pip_ninja_on_path, set_environment_defaults
from transformer_mt.runtime.device import (
    DTYPES,
    RuntimeSetupError,
    accumulator_dtype,
    auto_dtype,
    autocast,
    check_dtype,
    pick_device,
    seed_everything,
    set_threads,
    use_cuda,
)
from transformer_mt.runtime.distributed import (
    DistInfo,
    DistributedError,
    all_reduce_sum,
    all_reduce_sum_,
    dist_info,
    init_distributed,
    main_first,
    on_main,
    seed_for_rank,
    shutdown_distributed,
    wrap_ddp,
)
from transformer_mt.runtime.flops import (
    batches_train_flops,
    cached_peak,
    cost_summary,
    decode_flops,
    format_cost,
    forward_flops,
    measure_peak,
    peak_for,
    per_target_token,
    train_flops,
)
from transformer_mt.runtime.memory import reuse_freed_memory
from transformer_mt.runtime.syncs import SyncCounter, per_call

__all__ = [
    "DTYPES",
    "DistInfo",
    "DistributedError",
    "ONEDNN_CACHE_ENTRIES",
    "RuntimeSetupError",
    "SyncCounter",
    "accumulator_dtype",
    "all_reduce_sum",
    "all_reduce_sum_",
    "auto_dtype",
    "autocast",
    "batches_train_flops",
    "cached_peak",
    "check_dtype",
    "cost_summary",
    "decode_flops",
    "dist_info",
    "format_cost",
    "forward_flops",
    "init_distributed",
    "main_first",
    "measure_peak",
    "on_main",
    "peak_for",
    "per_call",
    "per_target_token",
    "pick_device",
    "put_pip_ninja_on_path",
    "reuse_freed_memory",
    "seed_everything",
    "seed_for_rank",
    "set_environment_defaults",
    "set_threads",
    "shutdown_distributed",
    "train_flops",
    "use_cuda",
    "wrap_ddp",
]
