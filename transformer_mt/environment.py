"""The process's environment defaults, set when a command or ``transformer_mt.load`` starts, never at import.

Part of the runtime layer (``transformer_mt.runtime`` exports these functions), in a module of its own that imports
neither torch nor the runtime package, so that ``tmt``'s ``main`` calls it before anything else and ``tmt --help``
stays instant. :func:`set_environment_defaults` (``tmt``'s ``main`` and ``load`` call it first) sets:

- the size of oneDNN's two primitive caches (:func:`bound_onednn_caches`), which are read at oneDNN's first call;
- ninja's place on ``PATH`` (:func:`put_pip_ninja_on_path`), for the build of the C++ CPU kernels.

Each keeps a value the user set. A library caller that builds models itself calls :func:`set_environment_defaults`
first; the kernels' build puts ninja on ``PATH`` itself too, at the moment it runs.
"""

from __future__ import annotations

import os
import shutil

# oneDNN keeps each matmul it has built (one per shape, holding buffers sized by the row count) in two caches,
# torch's ideep layer's and oneDNN's own, of 1,024 entries each by default. A training run meets a new row count
# with nearly every batch, so with the defaults a recipe run grew by 750 MiB in 300 updates and kept growing. Both
# are read at the first oneDNN call; 64 entries each keep the process within about 200 MiB of torch's mm path, at the
# same speed (docs/benchmarks.md).
ONEDNN_CACHE_ENTRIES = 64
ONEDNN_CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def set_environment_defaults() -> None:
    """Everything below, each kept where the user set it. Call it before the process's first oneDNN product."""
    bound_onednn_caches()
    put_pip_ninja_on_path()


def bound_onednn_caches() -> None:
    """oneDNN's and ideep's primitive caches at :data:`ONEDNN_CACHE_ENTRIES` entries each, unless set already."""
    for name in ONEDNN_CACHE_VARIABLES:
        os.environ.setdefault(name, str(ONEDNN_CACHE_ENTRIES))


def put_pip_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the ``fast`` extra's pip package puts it in the environment's bin folder,
    which is not on PATH when a virtual environment's python runs without being activated."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja  # the `fast` extra
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
