"""Counting host-device synchronisations, on any device, CPU included.

A GPU runs ahead of the Python that feeds it: kernels are queued, and the host waits only when it
needs a value back. Every such wait (a *sync*) drains the queue and leaves the GPU idle while the
host catches up, so the hot loops (a training update, a beam-search step) should hold as few as
possible. :class:`SyncCounter` is a ``TorchDispatchMode`` that counts the operations which force
one, by their aten op, wherever they run. On a CPU nothing actually waits, but the same ops are
called, so the counts a CPU measures are the counts a GPU would pay (tests hold them to targets):

==================================  ==========================================================
what the code does                  op counted (``SyncCounter.counts`` key)
==================================  ==========================================================
``.item()``, ``float(t)``,          ``_local_scalar_dense``
``int(t)``, ``bool(t)``, ``if t:``
``t.nonzero()``, ``torch.where(c)``  ``nonzero``
``t[mask]`` (bool index), its       ``index`` / ``index_put`` with a bool index (nonzero inside)
backward, ``t[mask] = x``
``masked_select``, ``unique``,      the op's name (the output size depends on the data)
``repeat_interleave(tensor)``
without ``output_size``,
``bincount``
``torch.equal(a, b)``               ``equal`` (returns a Python bool)
``t.tolist()``, ``t.numpy()``       ``tolist`` / ``numpy`` (on a GPU: the device-to-host ``_to_copy``)
``t.cpu()``, ``t.to("cpu")`` of a   ``to_host`` (a GPU only: on a CPU the copy is a no-op)
device tensor
a blocking host-to-device copy      ``to_device_blocking`` (torch waits for the stream after a copy
                                    from pageable memory without ``non_blocking``; GPU only)
==================================  ==========================================================

Collectives (``c10d`` all_reduce, broadcast, ...) are counted apart, under ``collectives``: with
NCCL they are queued like kernels and need not block the host, but each one has a latency of its own.

Usage::

    with SyncCounter() as syncs:
        trainer_update()
    syncs.total, syncs.counts, syncs.sites   # sites: (op, "file.py:line") in transformer_mt

Host-side tensors are the blind spot on a CPU: a tensor the host builds for itself (a collated
batch before it is moved) is indistinguishable from a device tensor there, so code under test keeps
its host work in numpy or outside the counted block. Overhead: one Python call per aten op, so
count a few updates or steps, never a whole run.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
T = TypeVar("T")

# Ops whose output size or value the host must read: a sync wherever their input lives.
_ALWAYS = {
    "_local_scalar_dense": "item",
    "item": "item",  # seen instead of _local_scalar_dense under inference_mode (item is composite there)
    "is_nonzero": "item",
    "allclose": "item",
    "nonzero": "nonzero",
    "masked_select": "masked_select",
    "equal": "equal",
    "_unique": "unique",
    "_unique2": "unique",
    "unique_dim": "unique",
    "unique_consecutive": "unique",
    "unique_dim_consecutive": "unique",
    "bincount": "bincount",
    "histc": "histc",
}
_PACKAGE = str(Path(__file__).resolve().parent.parent)  # the transformer_mt package


def _has_bool_index(indices) -> bool:  # indices: a list of optional tensors
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class SyncCounter(TorchDispatchMode):
    """Counts the ops inside its ``with`` block that make the host wait for the device (see the module
    docstring). ``counts``: op kind -> number; ``total``: their sum; ``collectives``: c10d ops, apart;
    ``sites``: (op kind, "file.py:line" of the innermost transformer_mt frame) -> number, to find them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()
        self.collectives: collections.Counter[str] = collections.Counter()
        self._patched: dict[str, object] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
        self.sites.clear()
        self.collectives.clear()

    # ------------------------------------------------------------ the counting
    def _count(self, kind: str) -> None:
        self.counts[kind] += 1
        frame: FrameType | None = sys._getframe(1)
        site = "?"
        while frame is not None:
            if frame.f_code.co_filename.startswith(_PACKAGE) and not frame.f_code.co_filename.endswith("syncs.py"):
                site = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
                break
            frame = frame.f_back
        self.sites[(kind, site)] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # the dispatch signature
        kwargs = kwargs or {}
        name = func._schema.name
        short = name.split("::", 1)[-1]
        if name.startswith("c10d::"):
            self.collectives[short.rstrip("_")] += 1
        elif short in _ALWAYS:
            self._count(_ALWAYS[short])
        elif short in ("index", "_index_put_impl_", "index_put", "index_put_") and _has_bool_index(
            args[1] if len(args) > 1 else kwargs.get("indices")
        ):
            self._count(short.strip("_").replace("_impl", ""))
        elif (
            func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor)
            and kwargs.get("output_size") is None
        ):
            self._count("repeat_interleave")  # the output size is the sum of the repeats
        elif short in ("_to_copy", "copy_"):
            self._count_copy(short, args, kwargs)
        return func(*args, **kwargs)

    def _count_copy(self, short: str, args, kwargs) -> None:
        src = args[0] if short == "_to_copy" else args[1]
        dst = kwargs.get("device") if short == "_to_copy" else args[0].device
        if not isinstance(src, torch.Tensor) or dst is None:
            return
        dst = torch.device(dst)
        if src.device.type != "cpu" and dst.type == "cpu":
            self._count("to_host")
        elif (
            src.device.type == "cpu"
            and dst.type != "cpu"
            and not kwargs.get("non_blocking", args[2] if short == "copy_" and len(args) > 2 else False)
        ):
            self._count("to_device_blocking")

    # ------------------------------------------------------------ tolist / numpy: no aten op on a CPU tensor
    def __enter__(self) -> SyncCounter:
        for method in ("tolist", "numpy"):
            original = getattr(torch.Tensor, method)
            self._patched[method] = original

            def wrapped(tensor, *a, _original=original, _kind=method, **kw):
                if tensor.device.type == "cpu":  # a device tensor's copy to the host is counted as to_host instead
                    self._count(_kind)
                return _original(tensor, *a, **kw)

            setattr(torch.Tensor, method, wrapped)
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for method, original in self._patched.items():
            setattr(torch.Tensor, method, original)
        self._patched.clear()
        return super().__exit__(*exc)

    def summary(self) -> str:
        """One line: total, then per kind, then the sites (for assertion messages)."""
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.counts.items()))
        sites = ", ".join(f"{k}@{s} x{n}" for (k, s), n in sorted(self.sites.items()))
        return f"{self.total} syncs ({kinds}) at {sites}" if self.total else "0 syncs"


def per_call(obj: object, method: str, fn: Callable[[], T]) -> tuple[T, SyncCounter, list[int]]:
    """Run ``fn()`` under a :class:`SyncCounter`, noting the count at every call of ``obj.<method>`` (e.g. a
    model's ``decode_step``: one call per search step). Returns fn's result, the counter, and the syncs
    between consecutive calls: entry i covers call i up to call i + 1 (the last entry: up to the end)."""
    marks: list[int] = []
    original, own = getattr(obj, method), method in vars(obj)  # own: set on the instance, not the class's method
    with SyncCounter() as counter:

        def marked(*args, **kwargs):  # passes everything through
            marks.append(counter.total)
            return original(*args, **kwargs)

        setattr(obj, method, marked)
        try:
            result = fn()
        finally:
            if own:
                setattr(obj, method, original)
            else:
                delattr(obj, method)  # the class's method shows through again
    ends = marks[1:] + [counter.total]
    return result, counter, [b - a for a, b in zip(marks, ends)]
