"""The static decoder cache: self-attention keys and values preallocated to the longest output and written in place,
so that every decoding step has the same shapes and reads and writes the same addresses (what a step captured once as
a CUDA graph and replayed needs; :mod:`transformer_mt.decoding.graphs`).

A step at position t writes its K/V at position t of every row (``index_copy_`` at the device tensor ``position``,
no host sync) and attends over all T positions, those after t masked (``self_allowed``, computed on the device from
``position``); the source side is computed once, as in :class:`~transformer_mt.model.cache.DecoderCache`. A reorder
(expansion to beams, beam reshuffles, finished sentences) copies rows within the buffers (``index_select`` into a
temporary, copied back), so that they keep their addresses: the live rows are always the first ``rows``, the live
groups the first ``groups``. Positions not yet written hold zeros or finite stale values, which the mask gives weight
exactly 0 (never NaN: a masked key's value is multiplied by 0, so it must be finite).

Shapes as in :mod:`~transformer_mt.model.cache`: R rows, G groups of ``group`` rows (a sentence's beams), L decoder
layers, H heads, S source positions, Dk / Dv key / value size per head; T the positions the buffers hold (the longest
output); Rc, Gc, Sc the buffers' capacity in rows, groups and source positions. Masks: True = attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.model.cache import row_layout
from transformer_mt.model.output import StepOutput


@dataclass(eq=False)
class StaticBuffers:
    """The tensors of a static cache at their capacity; their addresses never change. A cache is a live extent of them
    (its first rows, groups and source positions); several caches may share one set: a search's, and the wider one a
    captured step runs on (its extra rows are dummies whose outputs nobody reads)."""

    cross_k: Tensor  # (L, Gc, H, Sc, Dk) the source side's keys, per group
    cross_v: Tensor  # (L, Gc, H, Sc, Dv)
    cross_allowed: Tensor | None  # (Gc, 1, 1, Sc) bool True = attend; None: no source position is padding
    keys: Tensor | None  # (L, Rc, H, T, Dk) self-attention keys; None until the first step allocates them
    values: Tensor | None  # (L, Rc, H, T, Dv)
    position: Tensor  # (1,) long: the position the next step writes
    self_allowed: Tensor  # (1, 1, 1, T) bool: the positions <= position, True = attend
    steps: Tensor  # (1, 1, 1, T) long: 0 .. T-1, what self_allowed compares position with

    @classmethod
    def around(cls, cross_k: Tensor, cross_v: Tensor, cross_allowed: Tensor | None, *, max_len: int) -> StaticBuffers:
        """Buffers holding a batch's source side as they are, cross_k (L, B, H, S, Dk), cross_v (L, B, H, S, Dv),
        cross_allowed (B, 1, 1, S) or None, for outputs of up to ``max_len`` positions; the self-attention K/V are
        allocated by the first step, for the rows it decodes (a beam search expands its rows before)."""
        steps = torch.arange(max_len, device=cross_k.device).view(1, 1, 1, max_len)
        position = torch.zeros(1, dtype=torch.long, device=cross_k.device)
        return cls(cross_k, cross_v, cross_allowed, None, None, position, steps <= position, steps)

    @classmethod
    def zeros(
        cls,
        like_k: Tensor,
        like_v: Tensor,
        *,
        rows: int,
        groups: int,
        src_len: int,
        max_len: int,
    ) -> StaticBuffers:
        """Zero buffers for up to ``rows`` rows, ``groups`` groups, ``src_len`` source positions and ``max_len`` output
        positions, of the layers, heads, sizes, dtype and device of a source side like_k (L, B, H, S, Dk), like_v
        (L, B, H, S, Dv); the source mask allows every position, so that no row is ever left without a key."""
        layers, _, heads, _, dk = like_k.shape
        dv = like_v.size(-1)
        buffers = cls.around(
            like_k.new_zeros(layers, groups, heads, src_len, dk),
            like_v.new_zeros(layers, groups, heads, src_len, dv),
            torch.ones(groups, 1, 1, src_len, dtype=torch.bool, device=like_k.device),
            max_len=max_len,
        )
        buffers.allocate(rows, heads=heads, dk=dk, dv=dv, dtype=like_k.dtype)
        return buffers

    @property
    def max_len(self) -> int:
        """T, the positions each row holds."""
        return self.steps.size(-1)

    def allocate(self, rows: int, *, heads: int, dk: int, dv: int, dtype: torch.dtype) -> None:
        """Zero self-attention K/V for ``rows`` rows: (L, rows, H, T, Dk|Dv)."""
        layers, device = self.cross_k.size(0), self.cross_k.device
        self.keys = torch.zeros(layers, rows, heads, self.max_len, dk, dtype=dtype, device=device)
        self.values = torch.zeros(layers, rows, heads, self.max_len, dv, dtype=dtype, device=device)

    def load_source(self, cross_k: Tensor, cross_v: Tensor, cross_allowed: Tensor | None, *, src_len: int) -> None:
        """Groups [0, B) take a batch's source side, cross_k (L, B, H, S, Dk), cross_v (L, B, H, S, Dv), cross_allowed
        (B, 1, 1, S) or None (no padding), its positions [S, src_len) zero and masked off; the position goes back to 0.
        The buffers need a source mask (:meth:`zeros` makes one)."""
        assert self.cross_allowed is not None, "buffers built around an unpadded source take no other source"
        b, s = cross_k.size(1), cross_k.size(3)
        for buffer, given in ((self.cross_k, cross_k), (self.cross_v, cross_v)):
            buffer[:, :b, :, :s] = given
            buffer[:, :b, :, s:src_len] = 0
        allowed = self.cross_allowed[:b, :, :, :src_len]  # (B, 1, 1, src_len)
        allowed[..., :s] = True if cross_allowed is None else cross_allowed
        allowed[..., s:] = False
        self.rewind()

    def rewind(self) -> None:
        """Back to position 0 (nothing decoded); the values written stay, masked until written again."""
        self.seek(torch.zeros_like(self.position))

    def seek(self, position: Tensor) -> None:
        """Set the position (1,) the next step writes, on the device; the mask follows."""
        self.position.copy_(position)
        torch.le(self.steps, self.position, out=self.self_allowed)

    def advance(self) -> None:
        """One position further, on the device: a captured step does it too."""
        self.position.add_(1)
        torch.le(self.steps, self.position, out=self.self_allowed)


class StaticDecoderCache:
    """Incremental-decoding state of one batch in :class:`StaticBuffers`, the live extent of them: the first ``rows``
    rows, ``groups`` groups of ``group`` consecutive rows (a sentence's beams share its source side) and ``src_len``
    source positions; ``length`` positions decoded (the same on the device as ``buffers.position``).

    What a decoding step reads: :meth:`update` (write a layer's K/V at ``position``, return the layer's whole (R, H,
    T, D) buffers), ``self_allowed`` (its mask), ``cross_k`` / ``cross_v`` (L, G, H, S, D) and ``cross_allowed``
    (G, 1, 1, S) views, ``group``, ``output`` and ``kept_only``; then :meth:`advance`. None of it reads the device or
    depends on ``length``, so one step can be captured and replayed at every position.
    """

    def __init__(
        self,
        buffers: StaticBuffers,
        *,
        rows: int,
        groups: int,
        src_len: int,
        group: int = 1,
        output: StepOutput | None = None,
    ):
        """The live extent of ``buffers``: ``rows`` = ``groups`` * ``group`` rows, ``src_len`` source positions.
        ``output``: the output layer's matrix as the model scores with it, taken once for the whole search."""
        if rows != groups * group:
            raise ValueError(f"{rows} rows are not {groups} groups of {group}")
        self.buffers, self.output = buffers, output
        self.kept_only = False  # decode_step's logits: over the whole vocabulary, or over output.ids only
        self.rows, self.groups, self.group, self.src_len = rows, groups, group, src_len
        self.length = 0
        # Which sentence each row and each group holds (for a reorder that does not state its layout).
        self._group_source = torch.arange(groups, device=buffers.position.device)
        self._row_source = self._group_source.repeat_interleave(group)
        self._take_views()

    def _take_views(self) -> None:
        b, g, s = self.buffers, self.groups, self.src_len
        self.cross_k, self.cross_v = b.cross_k[:, :g, :, :s], b.cross_v[:, :g, :, :s]  # (L, G, H, S, Dk|Dv)
        self.cross_allowed = None if b.cross_allowed is None else b.cross_allowed[:g, :, :, :s]  # (G, 1, 1, S)

    def widened(self, groups: int) -> StaticDecoderCache:
        """A cache over the same buffers and position with ``groups`` >= its groups (and their rows): the extent a
        step bucketed to a larger batch runs on. Its extra rows are whatever the buffers hold there (finite)."""
        wide = StaticDecoderCache(
            self.buffers, rows=groups * self.group, groups=groups, src_len=self.src_len, group=self.group
        )
        wide.output, wide.kept_only = self.output, self.kept_only
        return wide

    def restrict_logits(self) -> Tensor | None:
        """As :meth:`DecoderCache.restrict_logits <transformer_mt.model.cache.DecoderCache.restrict_logits>`."""
        if self.output is None or self.output.ids is None:
            return None
        self.kept_only = True
        return self.output.ids

    @property
    def batch_size(self) -> int:
        """Rows (hypotheses) in the batch."""
        return self.rows

    @property
    def max_len(self) -> int:
        """T, the most positions a row can decode."""
        return self.buffers.max_len

    @property
    def position(self) -> Tensor:
        """(1,) long on the device: the position the next step decodes."""
        return self.buffers.position

    @property
    def self_allowed(self) -> Tensor:
        """(1, 1, 1, T) bool, True = attend: a step's self-attention mask, the positions up to ``position``."""
        return self.buffers.self_allowed

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k (R, H, 1, Dk), v (R, H, 1, Dv) at ``position`` of ``layer`` in place and return that layer's keys
        (R, H, T, Dk) and values (R, H, T, Dv), all T positions (the caller masks them with ``self_allowed``)."""
        b = self.buffers
        if b.keys is None:  # the first step: the rows are known now
            b.allocate(self.rows, heads=k.size(1), dk=k.size(-1), dv=v.size(-1), dtype=k.dtype)
        elif layer == 0 and self.length >= b.max_len:
            raise ValueError(f"the static cache holds {b.max_len} positions; size it for the longest output")
        assert b.keys is not None and b.values is not None
        keys, values = b.keys[layer, : self.rows], b.values[layer, : self.rows]  # (R, H, T, Dk|Dv)
        keys.index_copy_(2, b.position, k)
        values.index_copy_(2, b.position, v)
        return keys, values

    def advance(self) -> None:
        """A step is done: every layer has written its position."""
        self.buffers.advance()
        self.length += 1

    def reorder(self, indices: Tensor, *, group: int | None = None, kept: Tensor | None = None) -> None:
        """As :meth:`DecoderCache.reorder <transformer_mt.model.cache.DecoderCache.reorder>` (``group`` and ``kept``
        state the new layout; without them it is read from ``indices``), in place: the new rows are copied to the
        first ``indices.size(0)`` rows of the buffers (the filled positions only) and the kept groups to the first
        groups. The new rows and groups must fit in the buffers."""
        b, n = self.buffers, indices.size(0)
        if b.keys is not None and b.values is not None:
            if n > b.keys.size(1):
                raise ValueError(f"a static cache of {b.keys.size(1)} rows cannot take {n}")
            t = self.length
            for buffer in (b.keys, b.values):  # (L, Rc, H, T, D): rows [0, n) <- the indexed live rows, filled prefix
                buffer[:, :n, :, :t] = buffer[:, : self.rows, :, :t].index_select(1, indices)
        row_source = self._row_source.index_select(0, indices)  # (R',) sentence of each new row
        if group is None:
            group, kept = row_layout(row_source, self._group_source)
        if kept is not None:
            g, s = kept.size(0), self.src_len
            if g > b.cross_k.size(1):
                raise ValueError(f"a static cache of {b.cross_k.size(1)} groups cannot take {g}")
            for buffer in (b.cross_k, b.cross_v):  # (L, Gc, H, Sc, D): groups [0, g) <- the kept groups
                buffer[:, :g, :, :s] = buffer[:, : self.groups, :, :s].index_select(1, kept)
            if b.cross_allowed is not None:
                b.cross_allowed[:g, :, :, :s] = b.cross_allowed[: self.groups, :, :, :s].index_select(0, kept)
            self._group_source = self._group_source.index_select(0, kept)
            self.groups = g
        self._row_source, self.group, self.rows = row_source, group, n
        self._take_views()
