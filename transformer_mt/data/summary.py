"""What loading a parallel corpus read, kept and dropped: :class:`CorpusSummary`, stored in its cache's meta.json
and shown in the log (the rules it counts are :mod:`transformer_mt.data.corpus`'s)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CorpusSummary:
    """What loading a parallel corpus read, kept and dropped."""

    src_path: str
    tgt_path: str
    filtered: bool = True  # max_len and ratio filters applied (training) or only counted (validation)
    max_len: int = 0
    max_len_ratio: float = 0.0
    min_len_for_ratio: int = 0
    pairs_read: int = 0  # lines in each file
    kept: int = 0
    dropped_empty: int = 0  # empty or whitespace-only on either side (or no pieces after normalisation)
    dropped_too_long: int = 0  # more than max_len pieces on either side
    dropped_ratio: int = 0  # longer side > max_len_ratio x shorter side
    long_kept: int = 0  # kept pairs the filters would have dropped (only when filtered is False)
    src_tokens: int = 0  # pieces in the kept sources, EOS not counted
    tgt_tokens: int = 0  # pieces in the kept targets, EOS not counted
    src_unk: int = 0  # <unk> pieces among src_tokens
    tgt_unk: int = 0
    src_max: int = 0  # longest kept source, in pieces
    tgt_max: int = 0
    cache: str = ""  # the cache directory
    from_cache: bool = False  # True when this load found the corpus already encoded
    name: str = ""  # the corpus's name in data.corpora (not stored: one cache may serve several names)
    cleaned: bool = False  # data.filters applied to the raw pairs
    dropped_filtered: int = 0  # dropped by data.filters (counted before encoding)
    filtered_by: dict[str, int] = field(default_factory=dict)  # those drops by the rule that dropped them

    def format(self) -> str:
        """A few lines for the log."""

        def side(name: str, tokens: int, unk: int, longest: int) -> str:
            avg = tokens / self.kept if self.kept else 0.0
            return f"{name} {tokens:,} (avg {avg:.1f}, max {longest}, unk {100 * unk / max(tokens, 1):.2f}%)"

        if self.filtered:
            dropped = (
                f"dropped: {self.dropped_empty:,} empty, {self.dropped_too_long:,} over {self.max_len} pieces, "
                f"{self.dropped_ratio:,} with length ratio over {self.max_len_ratio:g}"
            )
            if self.cleaned:
                rules = ", ".join(f"{rule} {n:,}" for rule, n in self.filtered_by.items())
                dropped += f", {self.dropped_filtered:,} by data.filters" + (f" ({rules})" if rules else "")
        else:
            dropped = (
                f"dropped: {self.dropped_empty:,} empty; not length-filtered: {self.long_kept:,} kept pairs are over "
                f"{self.max_len} pieces or length ratio {self.max_len_ratio:g}"
            )
        return "\n".join(
            [
                f"{self.name + ': ' if self.name else ''}{self.src_path} -> {self.tgt_path}: "
                f"{self.pairs_read:,} pairs read, "
                f"{self.kept:,} kept ({100 * self.kept / max(self.pairs_read, 1):.2f}%)",
                f"  {dropped}",
                "  tokens: "
                + side("source", self.src_tokens, self.src_unk, self.src_max)
                + ", "
                + side("target", self.tgt_tokens, self.tgt_unk, self.tgt_max),
                f"  cache: {self.cache} ({'loaded' if self.from_cache else 'written'})",
            ]
        )
