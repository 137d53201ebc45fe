"""The special token ids of one model: which id pads, which is unknown, which ends a sequence, which starts
the decoder.

A model trained by tmt uses its sentencepiece model's fixed ids (:data:`DEFAULT`: pad 0, unk 1, bos 2,
eos 3, the decoder starting from bos). An imported vocabulary brings its own: MarianMT's is eos 0, unk 1,
pad last, no bos, and its decoder starts from the pad id. The ids are the ``model.*_id`` keys of the
config (so a checkpoint carries them), and every layer that needs one asks a :class:`SpecialIds`: the
batches (padding, EOS, the decoder's first input), the model (padding masks, the embedding row that is
never trained), the loss (padding), the search (start, end, the ids never generated) and the tokenizer
(the ids dropped from detokenized text).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_mt.config import ModelConfig

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3  # the ids tmt trains its sentencepiece models with
NO_ID = -1  # model.bos_id: the vocabulary has no BOS; model.decoder_start_id: start from bos_id


@dataclass(frozen=True)
class SpecialIds:
    """pad fills batches (masked out of attention and the loss); unk stands for pieces outside the vocabulary;
    bos is the beginning-of-sentence piece (NO_ID: none); eos ends every source and target sequence; start is
    the decoder's first input (teacher forcing shifts the target right by it)."""

    pad: int = PAD_ID
    unk: int = UNK_ID
    bos: int = BOS_ID
    eos: int = EOS_ID
    start: int = BOS_ID

    @classmethod
    def of(cls, cfg: ModelConfig) -> SpecialIds:
        """The ids of ``model.pad_id`` ... ``model.decoder_start_id`` (the start defaults to bos)."""
        return cls(pad=cfg.pad_id, unk=cfg.unk_id, bos=cfg.bos_id, eos=cfg.eos_id, start=cfg.start_id)

    @property
    def never_generated(self) -> tuple[int, ...]:
        """Ids the search never emits: padding, the decoder's start and BOS (distinct, ascending). A start that is EOS
        (M2M100 / NLLB's decoder starts from ``</s>``) stays generable: it ends a hypothesis."""
        start = self.start if self.start != self.eos else NO_ID
        return tuple(sorted({i for i in (self.pad, start, self.bos) if i != NO_ID}))

    @property
    def not_text(self) -> frozenset[int]:
        """Ids that detokenization drops: padding, BOS, EOS and the decoder's start."""
        return frozenset(i for i in (self.pad, self.bos, self.eos, self.start) if i != NO_ID)

    @property
    def kept_ids(self) -> tuple[int, ...]:
        """Every special id (unk included), ascending: the ids an output layer restricted to the training data keeps."""
        return tuple(sorted({i for i in (self.pad, self.unk, self.bos, self.eos, self.start) if i != NO_ID}))


DEFAULT = SpecialIds()
