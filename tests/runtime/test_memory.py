"""runtime.reuse_freed_memory: with it, tensors allocated and freed over and over stop costing page faults; the
user's own allocator settings are left alone. Each case runs in a fresh interpreter, whose malloc starts from
glibc's defaults (the settings are process-wide and cannot be undone)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

try:
    ctypes.CDLL(ctypes.util.find_library("c") or None).gnu_get_libc_version  # noqa: B018 - glibc only
    GLIBC = True
except (OSError, AttributeError):
    GLIBC = False

# A training update's pattern: many large tensors held at once, then all freed; the heap's free top then outgrows
# glibc's default trim threshold, which hands it back to the kernel, and the next round faults it in again.
ROUNDS = """
import json, resource, sys, torch
from transformer_mt import runtime
applied = runtime.reuse_freed_memory()
def one_round():
    held = [torch.ones(3 * 2**20) for _ in range(12)]  # 12 x 12 MiB, each under glibc's 32 MiB mmap threshold cap
    del held
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_round()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _run(env_extra: dict[str, str]) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TMT_MALLOC") and not k.startswith("MALLOC_")
    }
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", ROUNDS], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_freed_memory_is_reused_without_page_faults():
    tuned, default = _run({}), _run({"TMT_MALLOC": "default"})
    assert tuned["applied"] and not default["applied"]
    pages = 5 * 12 * 12 * 2**20 // 4096  # what the five rounds touch
    # The default hands the heap back and faults it in again: every round in most runs (184,163 faults here), and in
    # about one run of four, where the heap's layout keeps part of it, 39,907 (measured over 12 runs).
    assert default["faults"] > pages // 8
    assert tuned["faults"] < pages // 50


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
        {"MALLOC_TRIM_THRESHOLD_": "1000000"},
        {"TMT_MALLOC": "default"},
    ],
)
def test_the_users_own_allocator_settings_are_kept(env):
    assert _run(env)["applied"] is False
