"""A decoder input that starts with forced pieces after the start id: NLLB's and M2M100's target language.

NLLB names the language to produce on the decoder's side (``model.decoder_languages``): its input is
[``</s>``, ``fra_Latn``] + the translation, and ``transformers`` forces the language code as the first generated
token (``forced_bos_token_id``), whose log-probability then counts 0. :class:`ForcedPrefix` is that model for the
searches: its cache has decoded the start and every forced piece but the last when the search gets it, and the
search's first step (the start id, at the position after them) reads the last forced piece instead. The searches
need nothing new: greedy, beam and sampling see a model whose first step scores the first real piece, and the
hypotheses hold only the pieces after the prefix. The forced pieces score nothing, as with ``forced_bos_token_id``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transformer_mt.config import ModelConfig, model_language
from transformer_mt.model import DecoderCache, EncoderOut, Ensemble, EnsembleCache, Transformer
from transformer_mt.text import LanguageError, Tokenizer


class ForcedPrefix:
    """``model`` (a :class:`~transformer_mt.model.Transformer`, or an :class:`~transformer_mt.model.Ensemble` of
    them) whose decoder input starts [start, *prefix]: a :class:`~transformer_mt.decoding.protocol.SearchModel` over
    its growing cache (a static cache is the model's own and is refused by the searches for this wrapper)."""

    def __init__(self, model: Transformer | Ensemble, prefix: Sequence[int]):
        if not prefix:
            raise ValueError("a forced prefix holds at least one id")
        self.model, self.prefix = model, tuple(int(i) for i in prefix)
        self.specials = model.specials

    @property
    def training(self) -> bool:
        return self.model.training

    @training.setter
    def training(self, mode: bool) -> None:
        self.model.train(mode)

    def encode(self, src: Tensor) -> EncoderOut | list[EncoderOut]:
        return self.model.encode(src)

    def reserve_positions(self, n: int) -> None:
        self.model.reserve_positions(n + len(self.prefix))

    def max_output_length(self) -> int | None:
        limit = self.model.max_output_length()
        return None if limit is None else limit - len(self.prefix)

    def init_cache(self, enc: EncoderOut | list[EncoderOut]) -> DecoderCache | EnsembleCache:
        """The model's cache with the start and every forced piece but the last decoded (their logits unused)."""
        cache = self.model.init_cache(enc)  # type: ignore[arg-type]  # an ensemble's encoder outputs are its own
        memory = (enc[0] if isinstance(enc, list) else enc).memory
        rows, device = memory.size(0), memory.device
        for token in (self.specials.start, *self.prefix[:-1]):
            step = torch.full((rows,), token, dtype=torch.long, device=device)
            self.model.decode_step(step, cache)  # type: ignore[arg-type]  # the model's own cache
        return cache

    def decode_step(self, tokens: Tensor, cache: DecoderCache | EnsembleCache) -> Tensor:
        """:meth:`Transformer.decode_step`; the search's first step (its start id) reads the last forced piece."""
        if cache.position == len(self.prefix):  # an int: no host sync
            tokens = torch.full_like(tokens, self.prefix[-1])
        return self.model.decode_step(tokens, cache)  # type: ignore[arg-type]  # the model's own cache


def decoder_language_ids(
    cfg: ModelConfig, tok: Tokenizer, tgt_lang: str | None, src_lang: str | None, *, where: str
) -> tuple[list[int], list[int]]:
    """An NLLB model's (``model.decoder_languages``) source prefix [code of ``src_lang``] and forced decoder prefix
    [code of ``tgt_lang``], their ids in ``tok``'s vocabulary; both languages must be among the model's, each refusal
    one line naming ``where`` and the languages it knows."""
    languages = cfg.decoder_languages.split()
    ids = []
    for option, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        code = None if lang is None else model_language(languages, lang)  # M2M100's __fr__ also as fr
        if lang is None or code is None:
            shown = "" if lang is None else f" {lang[:40]!r} is not one of its languages;"
            raise LanguageError(
                f"{where} names the language on both sides (NLLB);{shown} give {option}, one of "
                f"{', '.join(languages[:20])}{' ...' if len(languages) > 20 else ''}"
            )
        ids.append([tok.tag_ids([code], where=where)[0]])
    return ids[0], ids[1]
