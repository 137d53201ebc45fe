"""The harness of the hostile-input suites: run `tmt` in this process on a crafted file and check that it
either works or refuses in one line, within a memory bound.

A refusal is what a user must see for a file a stranger made: exit code 2, stderr exactly one line
``tmt: error: ...`` that names the file (and the field, where there is one), no traceback. Anything
else that escapes ``main`` (a ``KeyError``, a ``RecursionError``, a ``MemoryError``) propagates, so
Hypothesis reports and shrinks it as the bug it is.

The memory bound: while a suite runs, :func:`address_space_limit` caps the process's address space at
what it already maps plus :data:`MEMORY_BOUND_MIB`, so a file that asks for 100 GB fails at once (as a
``MemoryError`` or torch's "can't allocate", a test failure) instead of swapping the machine; and
:func:`run_tmt` measures the resident-set growth of each case, which the suites assert stays under the
same bound.

Examples: each suite asks for :func:`examples` (its CI default, a few hundred in all), or
``TMT_HOSTILE_EXAMPLES=N`` for N each, with a random seed instead of the fixed one CI uses.
:data:`TRIED` counts the cases, and the run's summary line reports them.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

MEMORY_BOUND_MIB = 1536  # what one refused (or accepted) case may add to the address space of the process
TRIED: Counter[str] = Counter()  # cases run per suite, for the run's summary line
_PAGE = os.sysconf("SC_PAGE_SIZE")


def examples(ci_default: int) -> settings:
    """Hypothesis settings for one hostile suite: ``ci_default`` examples with a fixed seed (so CI is
    repeatable), or ``TMT_HOSTILE_EXAMPLES`` examples with a random one."""
    wanted = int(os.environ.get("TMT_HOSTILE_EXAMPLES", "0"))
    return settings(
        max_examples=wanted or ci_default,
        derandomize=not wanted,
        deadline=None,  # a case loads a model: its time varies with the machine, not with the bug
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@dataclass
class Outcome:
    """What one `tmt` run gave: exit code, stdout, stderr, and the growth of the resident set (MiB)."""

    code: int
    out: str
    err: str
    rss_growth_mib: float


def _resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * _PAGE / 2**20


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * _PAGE


def run_tmt(args: Sequence[object], *, suite: str) -> Outcome:
    """``tmt ARGS`` through the console entry point in this process, its output captured; counted under ``suite``."""
    from transformer_mt.cli import main

    TRIED[suite] += 1
    out, err = io.StringIO(), io.StringIO()
    before = _resident_mib()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Outcome(code, out.getvalue(), err.getvalue(), _resident_mib() - before)


def assert_refused_in_one_line(outcome: Outcome, *, names: Sequence[str | Path] = ()) -> None:
    """Exit code 2 and exactly one stderr line ``tmt: error: ...`` mentioning each of ``names`` (a file's
    name, a field), no traceback, and the memory bound kept."""
    lines = outcome.err.splitlines()
    assert outcome.code == 2, f"exit code {outcome.code}, stderr: {outcome.err[-2000:]}"
    assert len(lines) == 1, f"{len(lines)} stderr lines, want one:\n{outcome.err[-2000:]}"
    assert lines[0].startswith("tmt: error: "), lines[0]
    assert "Traceback" not in outcome.err + outcome.out
    for name in names:
        assert str(name) in lines[0], f"{name!r} not named in: {lines[0]}"
    assert len(lines[0]) <= 600, f"an error line of {len(lines[0])} characters: {lines[0][:200]}..."
    assert_within_memory(outcome)


def assert_within_memory(outcome: Outcome) -> None:
    assert outcome.rss_growth_mib < MEMORY_BOUND_MIB, f"the resident set grew by {outcome.rss_growth_mib:.0f} MiB"


@contextlib.contextmanager
def address_space_limit(extra_mib: int = MEMORY_BOUND_MIB) -> Iterator[None]:
    """Cap this process's address space at what it maps now plus ``extra_mib`` (restored on exit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _mapped_bytes() + extra_mib * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def memory_limit() -> Iterator[None]:
    """The address-space cap of :func:`address_space_limit` for the length of one test (all its examples).
    Off on other platforms than Linux, where /proc/self/statm does not exist."""
    if not sys.platform.startswith("linux"):
        yield
        return
    with address_space_limit():
        yield


def summary_line() -> str | None:
    """``hostile-input suites: N cases tried (suite: n, ...)`` once any ran, else None."""
    if not TRIED:
        return None
    parts = ", ".join(f"{name}: {count}" for name, count in sorted(TRIED.items()))
    return f"hostile-input suites: {sum(TRIED.values())} cases tried ({parts})"
