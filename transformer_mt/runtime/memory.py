"""The C allocator under torch's CPU tensors: keep freed memory for the next tensor instead of handing it back.

torch allocates every CPU tensor with ``malloc`` and frees it as soon as the last reference goes. glibc's malloc
serves blocks over its mmap threshold (128 KiB at first, raised as such blocks are freed) with a fresh ``mmap``
and unmaps them on ``free``, and it hands the top of its heap back to the kernel once more than the trim
threshold is free there. A training update or a search step allocates and frees the same large tensors again and
again (activations, logits, a growing cache), so the kernel maps and zeroes the same pages again on every step:
page faults, which cost most under a virtual machine. :func:`reuse_freed_memory` sets glibc's mmap threshold to
its largest value (32 MiB, which also stops it from moving) and the trim threshold out of reach, so that
blocks below 32 MiB come from the heap and freed memory stays in the process for the next step. The process
then keeps its peak heap: memory a run held once stays held, as a caching allocator's would.

Nothing is done when the C library is not glibc (no ``mallopt``), when the user chose the allocator's settings
(``GLIBC_TUNABLES`` naming malloc, or glibc's ``MALLOC_MMAP_THRESHOLD_``-style variables), or when
``TMT_MALLOC=default`` asks for none.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes a C int: the largest, 2 GiB, never trims a training heap in practice

# glibc's own environment variables for the same settings
_GLIBC_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_done: bool | None = None  # the first call's outcome


def reuse_freed_memory() -> bool:
    """Set glibc malloc to keep freed memory for reuse (the module's docstring says why), once per process.
    Returns whether the settings are in force: False without glibc, or when the environment chose otherwise."""
    global _done
    if _done is None:
        _done = _apply()
    return _done


def _user_chose() -> bool:
    env = os.environ
    if env.get("TMT_MALLOC", "").strip().lower() == "default":
        return True
    return "glibc.malloc" in env.get("GLIBC_TUNABLES", "") or any(name in env for name in _GLIBC_MALLOC_VARIABLES)


def _apply() -> bool:
    if _user_chose():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        if not hasattr(libc, "gnu_get_libc_version"):  # not glibc: its mallopt, if any, means other things
            return False
        mallopt = libc.mallopt
    except OSError:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting the mmap threshold also stops glibc from moving it
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
