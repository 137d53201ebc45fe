"""The decoder's key/value cache for incremental decoding: a small object the search owns.

:meth:`Transformer.init_cache <transformer_mt.model.transformer.Transformer.init_cache>` builds one per batch and
:meth:`~transformer_mt.model.transformer.Transformer.decode_step` writes to it; the search only calls
:meth:`DecoderCache.reorder` (expand rows to beams, follow beam reshuffles, drop finished sentences).

Shapes: R rows (hypotheses), G groups of rows that translate the same sentence, L decoder layers,
H heads, S source length, Dk / Dv key / value size per head. Masks: ``src_pad`` True = padding
position; ``cross_allowed`` True = this query may attend to this key (the model's conventions).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.model.attention import allowed_mask
from transformer_mt.model.output import StepOutput


class DecoderCache:
    """Incremental-decoding state for one batch: per decoder layer, self-attention K/V grown by one
    position per step, and cross-attention K/V computed once from the encoder output; plus the source
    padding mask and the number of positions decoded so far (`length`).

    Tensors: ``self_k`` and ``self_v``, per layer (capacity, R, H, Dk|Dv) for the R rows (hypotheses),
    time-major so that the filled positions [0, length) are one contiguous block: a reorder copies
    exactly them. Capacity doubles when full, so appending a step copies only the new position
    (amortised), unlike re-concatenating the prefix.
    Source side, stored once per *group* of ``group`` consecutive rows that translate the same
    sentence (the beams of a sentence): ``cross_k`` (L, G, H, S, Dk), ``cross_v`` (L, G, H, S, Dv),
    ``src_pad`` (G, S) bool True = pad, ``cross_allowed`` (G, 1, 1, S) bool True = attend (None: no
    padding), R = G * group. A sentence's beams then query one copy of its encoder output, beam reorders
    never copy it, and dropping a finished sentence copies 1/group of what per-row storage would.

    Host syncs: none when the search states the new row layout in :meth:`reorder` (``group``, ``kept``);
    a bare ``reorder(indices)`` works the layout out from the indices, which reads them back (a few syncs).
    """

    self_allowed: Tensor | None = None  # a step's self-attention mask: none, every cached position is in its past

    def __init__(
        self,
        cross_k: Tensor,
        cross_v: Tensor,
        src_pad: Tensor,
        cross_allowed: Tensor | None,
        *,
        output: StepOutput | None = None,
    ):
        """cross_k (L, B, H, S, Dk), cross_v (L, B, H, S, Dv), src_pad (B, S) True = pad, and the model's
        cross-attention mask built from it, cross_allowed (B, 1, 1, S) True = attend, or None (no padding);
        ``output``: the output layer's matrix as the model scores with it, taken once for the whole search."""
        self.cross_k, self.cross_v, self.src_pad = cross_k, cross_v, src_pad
        self.cross_allowed = cross_allowed
        self.output = output
        self.kept_only = False  # decode_step's logits: over the whole vocabulary, or over output.ids only
        self.group = 1
        # Which original sentence each row and each group holds: rows of one sentence share its cross K/V.
        self._row_source = torch.arange(src_pad.size(0), device=src_pad.device)
        self._group_source = self._row_source
        self.reset()

    def restrict_logits(self) -> Tensor | None:
        """From now on ``decode_step`` returns logits (R, K) over the output layer's K kept ids only (a model with
        ``model.restrict_output``), rather than (R, V) with -inf at the other ids; returns those ids (K,), ascending,
        so that column j stands for id ``ids[j]``. None, and nothing changes, when the model scores every id."""
        if self.output is None or self.output.ids is None:
            return None
        self.kept_only = True
        return self.output.ids

    @property
    def batch_size(self) -> int:
        """Rows (hypotheses) in the batch."""
        return self._row_source.size(0)

    def reset(self) -> None:
        """Forget the decoded prefix (self-attention K/V, length = 0); the source side stays as it is."""
        self.self_k: list[Tensor] = []  # per layer; empty until the first update allocates them
        self.self_v: list[Tensor] = []
        self.length = 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k (R, H, n, Dk), v (R, H, n, Dv) at positions [length, length + n) of ``layer`` and return
        that layer's keys (R, H, length + n, Dk) and values (R, H, length + n, Dv) (strided views, no copy).
        Every layer writes the same positions; the caller advances ``length`` once all layers are done."""
        start, end = self.length, self.length + k.size(2)
        if not self.self_k or end > self.self_k[0].size(0):
            self._grow(k, v, capacity=max(16, 2 * end))
        self.self_k[layer][start:end] = k.permute(2, 0, 1, 3)  # (R, H, n, Dk) -> (n, R, H, Dk)
        self.self_v[layer][start:end] = v.permute(2, 0, 1, 3)
        # (T, R, H, D) -> (R, H, T, D): SDPA reads the strides, the last dimension stays contiguous
        return self.self_k[layer][:end].permute(1, 2, 0, 3), self.self_v[layer][:end].permute(1, 2, 0, 3)

    def _grow(self, k: Tensor, v: Tensor, *, capacity: int) -> None:
        """Per layer, time-major buffers (capacity, R, H, D): the filled prefix [:length] is contiguous,
        so reorder() copies exactly it, straight into the new buffer."""
        n_layers, (rows, h, _, dk), dv = self.cross_k.size(0), k.shape, v.size(-1)
        new_k = [k.new_empty(capacity, rows, h, dk) for _ in range(n_layers)]
        new_v = [v.new_empty(capacity, rows, h, dv) for _ in range(n_layers)]
        for new, old in zip(new_k + new_v, self.self_k + self.self_v):  # nothing to copy before the first update
            new[: self.length] = old[: self.length]
        self.self_k, self.self_v = new_k, new_v

    def reorder(self, indices: Tensor, *, group: int | None = None, kept: Tensor | None = None) -> None:
        """Row i becomes old row ``indices[i]`` (LongTensor (R',), any R'), for every tensor of the cache:
        expand to B*beam, reorder beams, drop finished sentences.

        ``group`` (with ``kept``) states the new layout, so that nothing is read back from the device: the new
        rows are runs of ``group`` consecutive rows, one sentence per run, run j translating the sentence of
        current group ``kept[j]`` (LongTensor (G',)); ``kept`` None: the current groups, in their order (a
        beam reshuffle, or the expansion of sentences to beams). Without ``group`` the layout is worked out
        from ``indices`` (host syncs), for any reorder."""
        n = self.length
        for buffers in (self.self_k, self.self_v):  # empty before the first update
            for i, old in enumerate(buffers):
                buffers[i] = old.new_empty(old.size(0), indices.size(0), *old.shape[2:])  # (capacity, R', H, D)
                if old.requires_grad:  # autograd has no out= form (only outside inference_mode / no_grad)
                    buffers[i][:n] = old[:n].index_select(1, indices)
                else:
                    torch.index_select(old[:n], 1, indices, out=buffers[i][:n])  # the filled prefix only
        row_source = self._row_source.index_select(0, indices)  # (R',) sentence of each new row
        if group is None:
            group, kept = self._layout(row_source)
        if kept is not None:
            self.cross_k, self.cross_v = self.cross_k.index_select(1, kept), self.cross_v.index_select(1, kept)
            self.src_pad = self.src_pad.index_select(0, kept)
            if self.cross_allowed is not None:
                self.cross_allowed = self.cross_allowed.index_select(0, kept)
            self._group_source = self._group_source.index_select(0, kept)
        self._row_source, self.group = row_source, group

    def joined(self, other: DecoderCache) -> DecoderCache:
        """A new cache over this cache's rows, then ``other``'s, both of the same model, one row per sentence
        (``group`` 1) and at the same ``length``: greedy search carries a batch's last rows along with the next
        batch. The narrower source side is padded to the wider one's length, its new positions masked; a query
        then attends to exactly the keys it attended to before."""
        if self.length != other.length or self.group != 1 or other.group != 1 or self.kept_only != other.kept_only:
            raise ValueError(
                "only caches at the same step with one row per sentence join "
                f"(lengths {self.length} and {other.length}, groups {self.group} and {other.group})"
            )
        width = max(self.src_pad.size(1), other.src_pad.size(1))

        def padded(t: Tensor, dim: int, value: float | bool) -> Tensor:  # source positions up to `width` along `dim`
            missing = width - t.size(dim)
            return (
                t
                if missing == 0
                else torch.cat([t, t.new_full((*t.shape[:dim], missing, *t.shape[dim + 1 :]), value)], dim=dim)
            )

        src_pad = torch.cat([padded(self.src_pad, 1, True), padded(other.src_pad, 1, True)])  # (G, S)
        padding = (
            self.cross_allowed is not None
            or other.cross_allowed is not None
            or self.src_pad.size(1) != other.src_pad.size(1)
        )
        cache = DecoderCache(
            torch.cat([padded(self.cross_k, 3, 0.0), padded(other.cross_k, 3, 0.0)], dim=1),  # (L, G, H, S, Dk)
            torch.cat([padded(self.cross_v, 3, 0.0), padded(other.cross_v, 3, 0.0)], dim=1),
            src_pad,
            allowed_mask(src_pad) if padding else None,
            output=self.output,
        )
        cache.kept_only = self.kept_only
        cache.length = self.length
        if self.self_k:  # both have decoded at least one position: copy the filled prefixes, one buffer per layer
            rows = self.batch_size
            for mine, theirs, into in (
                (self.self_k, other.self_k, cache.self_k),
                (self.self_v, other.self_v, cache.self_v),
            ):
                for a, b in zip(mine, theirs):
                    buffer = a.new_empty(
                        max(a.size(0), b.size(0)), rows + b.size(1), *a.shape[2:]
                    )  # (capacity, R, H, D)
                    buffer[: self.length, :rows] = a[: self.length]
                    buffer[: self.length, rows:] = b[: self.length]
                    into.append(buffer)
        return cache

    def _layout(self, row_source: Tensor) -> tuple[int, Tensor | None]:
        return row_layout(row_source, self._group_source)

    @property
    def position(self) -> int:
        """The position the next step decodes (its K/V go there): ``length``."""
        return self.length

    def advance(self) -> None:
        """A step is done: every layer has written its position."""
        self.length += 1


def row_layout(row_source: Tensor, group_source: Tensor) -> tuple[int, Tensor | None]:
    """(group, kept) of new rows whose sentences are ``row_source`` (R',), over current groups that translate
    ``group_source`` (G,), read from the device: runs of equal sentences of one length, else one row per group;
    kept None when the groups stay as they are."""
    group = _run_length(row_source)
    if row_source.size(0) % group or not bool((row_source.view(-1, group) == row_source[::group, None]).all()):
        group = 1  # rows are not in equal runs of one sentence: one source copy per row
    new_group_source = row_source[::group]  # (G',)
    if torch.equal(new_group_source, group_source):
        return group, None
    # Where each sentence sits among the current groups (any copy will do: they are equal).
    where = torch.empty(int(group_source.max()) + 1, dtype=torch.long, device=row_source.device)
    where[group_source] = torch.arange(group_source.size(0), device=row_source.device)
    return group, where.index_select(0, new_group_source)


def _run_length(ids: Tensor) -> int:
    """Length of the leading run of equal values in ``ids`` (N,), N > 0."""
    differs = (ids != ids[0]).nonzero()
    return int(differs[0, 0]) if differs.numel() else ids.size(0)
