"""How a search runs its decoding steps: on the growing cache (the default), on a static cache, or on static buffers
shared by every batch, captured once per batch bucket as a CUDA graph and replayed (:class:`GraphedStep`).

Why: a step of a small model is hundreds of small kernels, each launched by Python, and a growing cache changes the
shapes at every step, so a GPU spends the step waiting for the host to launch the next kernel. A static cache
(:class:`~transformer_mt.model.StaticDecoderCache`: K/V preallocated, written in place at a device position, attention
masked to the filled prefix) keeps a step's shapes and addresses fixed; a CUDA graph then replays all its kernels
with one launch.

:class:`GraphedStep` owns one set of static buffers per model (per ensemble member), wide enough for the largest batch
seen: a batch's source side is copied in when its search starts (:meth:`GraphedStep.init_cache`), the rows its
reorders keep stay at the front, and each step copies the tokens in, runs the step over the rows of its *bucket* (the
live groups rounded up to a power of two, the source width too; the rows past the batch are dummies whose outputs
nobody reads) and copies the logits of the live rows out. On CUDA the step of each bucket is captured once as a
graph (warmed up on a side stream first) and replayed; elsewhere the same buffers, buckets and copies run the step
eagerly (the *eager replay*, which the CPU tests prove). A batch outside the buckets (more rows than ``max_rows``, a
wider source than ``max_src``, a longer output than ``max_len``) runs eagerly on a static cache of its own.

One search at a time: a :class:`GraphedStep` serves the latest batch it started (an older batch's cache is refused),
so greedy search does not carry a batch's last rows into the next one with it; searches in several threads take
turns (each holds its ``lock`` throughout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from transformer_mt.decoding.protocol import SearchCache, SearchError, SearchModel
from transformer_mt.model import Ensemble, EnsembleCache, StaticBuffers, StaticDecoderCache, Transformer

SMALLEST_SOURCE_BUCKET = 8  # source widths are rounded up to a power of two, at least this


class StepRunner(Protocol):
    """What a search starts a batch's cache with and decodes each step through."""

    joins: bool  # whether two batches' caches may be joined (greedy search carries a batch's last rows along)

    def session(self) -> AbstractContextManager[object]:
        """Held for a whole search: a :class:`GraphedStep` serves one at a time (its lock), the others any number."""
        ...

    def init_cache(self, enc: Any, *, max_len: int, group: int) -> SearchCache:
        """A fresh cache for the batch ``enc`` encodes: outputs of up to ``max_len`` positions; the search will hold
        ``group`` rows per sentence (its beam)."""
        ...

    def decode_step(self, tokens: Tensor, cache: Any) -> Tensor:
        """The model's ``decode_step``: tokens (R,) -> logits (R, V or K); the cache advances by one position."""
        ...


class GrowingStep:
    """The model's own cache and step: ``init_cache``, ``decode_step`` (the default: a cache grown step by step)."""

    joins = True

    def __init__(self, model: SearchModel[Any, Any]):
        self.model = model

    def session(self) -> AbstractContextManager[object]:
        return nullcontext()

    def init_cache(self, enc: Any, *, max_len: int, group: int) -> SearchCache:  # noqa: ARG002 - it grows as needed
        return self.model.init_cache(enc)

    def decode_step(self, tokens: Tensor, cache: Any) -> Tensor:
        return self.model.decode_step(tokens, cache)


class StaticStep(GrowingStep):
    """A static cache of the batch's own, preallocated to its longest output, and the model's step run eagerly."""

    joins = False

    def __init__(self, model: Transformer | Ensemble):
        super().__init__(model)
        self.static_model = model

    def init_cache(self, enc: Any, *, max_len: int, group: int) -> SearchCache:  # noqa: ARG002 - rows fit as they come
        return self.static_model.init_static_cache(enc, max_len=max_len)


def step_runner(
    model: SearchModel[Any, Any], *, static_cache: bool = False, graphs: GraphedStep | None = None
) -> StepRunner:
    """The steps a search runs: ``graphs`` (static buffers, CUDA graphs), else a static cache per batch with
    ``static_cache``, else the model's growing cache."""
    if graphs is not None:
        if graphs.model is not model:
            raise SearchError("graphs: the GraphedStep was made for another model; make one for the model searched")
        return graphs
    if not static_cache:
        return GrowingStep(model)
    if not isinstance(model, (Transformer, Ensemble)):
        raise SearchError(f"static_cache needs a Transformer or an Ensemble, not a {type(model).__name__}")
    return StaticStep(model)


def static_decoding_by_default(model: Transformer | Ensemble) -> bool:
    """Whether a search of ``model`` should run on static buffers with CUDA graphs (:class:`GraphedStep`) unless told
    otherwise: when every member computes with the cuda backend on a CUDA device. A CPU keeps the growing cache."""
    members = [model] if isinstance(model, Transformer) else list(model.members)
    return all(m.ops.name == "cuda" and m.output_proj.weight.device.type == "cuda" for m in members)


class CapturedStep(NamedTuple):
    """A step captured on fixed buffers: ``replay()`` runs it again and leaves its logits in ``output``."""

    replay: Callable[[], None]
    output: Tensor


Capture = Callable[[Callable[[], Tensor]], CapturedStep]  # captures a step (a function of no arguments)


def capture_cuda_graph(step: Callable[[], Tensor], *, pool: Any, warmup: int = 2) -> CapturedStep:
    """``step`` warmed up ``warmup`` times on a side stream (lazy initialisations, autotuning), then captured as one
    CUDA graph in the memory pool ``pool`` (shared by a GraphedStep's graphs, which never run at once)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another thread's CUDA work (a server's other models) does not break this capture
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = step()
    return CapturedStep(graph.replay, output)


def bucket(n: int, *, top: int, smallest: int = 1) -> int:
    """``n`` rounded up to a power of two (at least ``smallest``), at most ``top`` (the top bucket, n <= top)."""
    return min(top, max(smallest, 1 << (n - 1).bit_length()))


@dataclass
class GraphStats:
    """What a :class:`GraphedStep` did, for a check that the fast path ran."""

    captures: int = 0  # steps captured as CUDA graphs (one per bucket, again after the buffers grow)
    replays: int = 0  # steps replayed from a graph
    eager_replays: int = 0  # steps run eagerly on the shared buffers (no capture: a CPU, or capture=False)
    eager_batches: int = 0  # batches outside the buckets, run eagerly on a static cache of their own
    growths: int = 0  # times the shared buffers were made larger (dropping the graphs)


class _Bucket(NamedTuple):
    """A bucket's step: the cache over its rows (live ones first, then dummies), its tokens, its captured form."""

    cache: Any  # the model's: a StaticDecoderCache, or an Ensemble's EnsembleCache of them
    tokens: Tensor  # (rows,) a view of the shared tokens buffer
    captured: CapturedStep | None


class GraphedStep:
    """A model's decoding step on shared static buffers, captured as a CUDA graph per batch bucket and replayed (the
    module's docstring). Satisfies :class:`StepRunner`: pass it to a search (``graphs=``) of the same ``model``.

    ``max_rows``, ``max_src``, ``max_len``: the largest batch (rows: sentences x beam), source width and output length
    the buffers grow to (powers of two, when a batch needs them); a batch beyond runs eagerly on its own static cache.
    The default rows take a batch of 4096 source tokens of short sentences at beam 5. Memory per member, per layer and
    head: keys and values of rows x output positions and of groups x source positions, each the batch's rounded up.
    ``capture``: None captures on a CUDA device and replays eagerly elsewhere; False never captures; True always does
    (with ``capturer``, what captures: CUDA graphs by default). The model must not change while a GraphedStep serves
    it (its weights are read at their addresses; a grown sinusoid table is noticed).
    """

    joins = False

    def __init__(
        self,
        model: Transformer | Ensemble,
        *,
        max_rows: int = 4096,
        max_src: int = 512,
        max_len: int = 1024,
        capture: bool | None = None,
        capturer: Capture | None = None,
    ):
        self.model = model
        self.members = [model] if isinstance(model, Transformer) else list(model.members)
        self.max_rows, self.max_src, self.max_len = max_rows, max_src, max_len
        device = self.members[0].output_proj.weight.device
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and capturer is None and device.type != "cuda":
            raise ValueError(f"capture=True needs a CUDA device, and the model is on {device}")
        self._capturer = capturer
        self.stats = GraphStats()
        self._pools: list[StaticBuffers] = []  # per member, the shared buffers (empty until the first batch)
        self._outputs: list[Any] = []  # per member, its output layer's StepOutput, taken with the buffers
        self._tokens = torch.empty(0, dtype=torch.long, device=device)  # (rows,) the shared tokens buffer
        self._buckets: dict[tuple[int, int, int, bool], _Bucket] = {}  # (groups, group, src_len, kept_only) -> step
        self._live: StaticDecoderCache | None = None  # the first member's cache of the batch being searched
        self._live_len = 0  # the positions that batch may decode
        self._tables: tuple[int, ...] = ()  # the sinusoid tables' addresses the graphs read
        self._graph_pool: Any = None
        self.lock = threading.RLock()  # held by a search from its first step to its last (session)

    def session(self) -> AbstractContextManager[object]:
        return self.lock

    @property
    def buckets(self) -> list[tuple[int, int, int]]:
        """The buckets whose steps are held (since the buffers last grew): (groups, rows per group, source width)."""
        return sorted({key[:3] for key in self._buckets})

    # ------------------------------------------------------------ a batch
    def init_cache(self, enc: Any, *, max_len: int, group: int = 1) -> SearchCache:
        """The batch's source side copied into the shared buffers (grown first if it needs more room), nothing decoded
        yet; or, outside the buckets, a static cache of its own."""
        encs = [enc] if isinstance(self.model, Transformer) else list(enc)
        own = [m.init_static_cache(e, max_len=max_len) for m, e in zip(self.members, encs)]  # (L, B, H, S, D) each
        batch, width = own[0].groups, own[0].src_len
        if batch * group > self.max_rows or width > self.max_src or max_len > self.max_len:
            self.stats.eager_batches += 1
            return self._as_model_cache(own)
        self._make_room(own, rows=batch * group, groups=batch, width=width, max_len=max_len)
        src_len = bucket(width, top=self.max_src, smallest=SMALLEST_SOURCE_BUCKET)
        caches = []
        for pool, output, cache in zip(self._pools, self._outputs, own):
            pool.load_source(cache.cross_k, cache.cross_v, cache.cross_allowed, src_len=src_len)
            caches.append(StaticDecoderCache(pool, rows=batch, groups=batch, src_len=src_len, output=output))
        self._live, self._live_len = caches[0], max_len
        return self._as_model_cache(caches)

    def _make_room(self, own: list[StaticDecoderCache], *, rows: int, groups: int, width: int, max_len: int) -> None:
        """Grow the shared buffers, to the next powers of two, where the batch needs more (the graphs go with them)."""
        have = self._pools[0] if self._pools else None
        need = (
            bucket(rows, top=self.max_rows),
            bucket(groups, top=self.max_rows),
            bucket(width, top=self.max_src, smallest=SMALLEST_SOURCE_BUCKET),
            bucket(max_len, top=self.max_len),
        )
        if have is not None:
            assert have.keys is not None
            held = (have.keys.size(1), have.cross_k.size(1), have.cross_k.size(3), have.max_len)
            if all(n <= h for n, h in zip(need, held)):
                return
            need = tuple(max(n, h) for n, h in zip(need, held))  # type: ignore[assignment] # four ints still
            self.stats.growths += 1
        r, g, s, t = need
        self._pools = [StaticBuffers.zeros(c.cross_k, c.cross_v, rows=r, groups=g, src_len=s, max_len=t) for c in own]
        self._outputs = [c.output for c in own]
        self._tokens = torch.full((r,), self.members[0].specials.start, dtype=torch.long, device=self._tokens.device)
        self._buckets.clear()

    def _as_model_cache(self, caches: list[StaticDecoderCache]) -> Any:  # what the model's decode_step takes
        return caches[0] if isinstance(self.model, Transformer) else EnsembleCache(caches)

    # ------------------------------------------------------------ a step
    def decode_step(self, tokens: Tensor, cache: Any) -> Tensor:
        """The model's step for the live rows: tokens (R,) copied in, the bucket's step replayed (or run eagerly), its
        logits (R, V or K) copied out; the cache advances by one position."""
        members: list[StaticDecoderCache] = [cache] if isinstance(cache, StaticDecoderCache) else cache.caches
        first = members[0]
        if not self._pools or first.buffers is not self._pools[0]:  # a batch outside the buckets
            return self.model.decode_step(tokens, cache)
        if first is not self._live:
            raise SearchError(
                "this cache's batch was replaced by a newer one: a GraphedStep serves one search at a time"
            )
        if first.length >= self._live_len:
            raise ValueError(f"the batch was started for {self._live_len} positions; start it for its longest output")
        step = self._bucket(first, members, tokens)
        if step.captured is None:
            self.stats.eager_replays += 1
            output = self.model.decode_step(step.tokens, step.cache)  # advances the shared position
        else:
            self.stats.replays += 1
            step.captured.replay()  # advances the shared position on the device
            output = step.captured.output
        for member in members:
            member.length += 1
        return output[: first.rows].clone()  # (R, V or K): the live rows, theirs to keep

    def _bucket(self, first: StaticDecoderCache, members: list[StaticDecoderCache], tokens: Tensor) -> _Bucket:
        """The step of the live rows' bucket, their tokens copied in; captured the first time on CUDA."""
        tables = tuple(m.pe.data_ptr() for m in self.members if not m.learned_positions)
        if tables != self._tables:  # a grown sinusoid table: the graphs read the old one
            self._buckets.clear()
            self._tables = tables
        capacity = min(self._tokens.size(0) // first.group, self._pools[0].cross_k.size(1))  # groups the buffers hold
        groups = bucket(first.groups, top=capacity)
        key = (groups, first.group, first.src_len, first.kept_only)
        self._tokens[: first.rows].copy_(tokens)
        step = self._buckets.get(key)
        if step is None:
            wide = self._as_model_cache([m.widened(groups) for m in members])
            rows = self._tokens[: groups * first.group]
            step = _Bucket(wide, rows, self._captured(wide, rows) if self.capture else None)
            self._buckets[key] = step
        return step

    def _captured(self, cache: Any, tokens: Tensor) -> CapturedStep:
        """The step on ``cache`` and ``tokens`` captured; the warm-up runs it for real, so the position is restored."""
        capturer = self._capturer
        if capturer is None:
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            capturer = partial(capture_cuda_graph, pool=self._graph_pool)
        positions = [pool.position.clone() for pool in self._pools]
        captured = capturer(partial(self.model.decode_step, tokens, cache))
        for pool, position in zip(self._pools, positions):
            pool.seek(position)
        self.stats.captures += 1
        return captured
