"""The Translator: a model (or an ensemble), its tokenizers and decode settings, text in, translations out.

`translate_ids` (:mod:`~transformer_mt.decoding.batching`) is the batched core (sort by length, batch by
source tokens, search, restore order); `Translator` adds the checkpoint, the tokenizers and the text rules:
- an empty or whitespace-only input line gives an empty output line (the model is not run);
- a line longer than the model allows is truncated, and one warning line counts them;
- n-best output (`translate_stream`) is `INDEX<TAB>SCORE<TAB>TEXT`, K lines per input line, INDEX 0-based, best
  first.

`load` (``transformer_mt.load``) builds a `Translator` from checkpoints. Its two ways to translate:
`translate(lines, beam=None, lenpen=None, nbest=1, sample=None, ...)`, the Python API (the checkpoint's decode
settings by default, plain texts back; ``sample=True`` draws samples instead of searching), and `translate_batch`,
what the CLI, the server and the evaluation call (every setting explicit, n-best lists and this call's
`TranslateStats` back).

A multilingual model (several target languages) is asked for one with ``tgt_lang``, which puts its tag (``<2fr>``)
at the start of every source; `LanguageTranslator` does that for any translator of text (`tmt translate --tgt-lang`).

A `Translator` is read-only once built: each call returns its own translations and stats, and the
model's position table is sized when loading, so decoding never changes the model. Several threads may
translate through one Translator at once (the HTTP server does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, overload

import torch

from transformer_mt import runtime
from transformer_mt.config import Config, beam_problem
from transformer_mt.decoding.batching import encode_sources, translate_ids
from transformer_mt.decoding.graphs import GraphedStep, static_decoding_by_default
from transformer_mt.decoding.lengths import positions_needed
from transformer_mt.decoding.loading import CheckpointModel, check_position_table, model_from_checkpoint
from transformer_mt.decoding.prefix import decoder_language_ids
from transformer_mt.decoding.results import (
    TextTranslator,
    TranslateError,
    TranslateStats,
    Translation,
    TranslationResult,
    checked_request,
)
from transformer_mt.decoding.sampling import Sampling, sampling_request
from transformer_mt.model import Ensemble, Transformer, choose_ops
from transformer_mt.text import LanguageError, Tokenizer, language_tags, tagged, target_languages


class Translator:
    """A model (or an ensemble of models sharing one tokenizer), its tokenizers and decoding
    settings, ready to translate text. Read-only after construction, so threads may share one."""

    def __init__(
        self,
        model: Transformer | Ensemble,
        src_tok: Tokenizer,
        tgt_tok: Tokenizer,
        cfg: Config,
        *,
        device: torch.device,
        max_src_tokens: int | None = None,
        source: str = "checkpoint",
        graphs: bool | None = None,
    ):
        self.model, self.src_tok, self.tgt_tok, self.cfg = model.eval(), src_tok, tgt_tok, cfg
        self.source = source  # where cfg (the decoding defaults) comes from, for messages
        self.device = device  # the weights already carry the decoding dtype (cast once at load)
        # The longest source the model accepts: learned positions have a fixed table; EOS takes one place.
        self.max_src_tokens = cfg.model.max_positions - 1 if max_src_tokens is None else max_src_tokens
        # Size the sinusoid table now for the longest source accepted and the longest output the decode
        # settings allow, so that no translate call (in any thread) ever has to grow it.
        self.positions = positions_needed(
            self.max_src_tokens + 1, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b
        )
        check_position_table(cfg, self.positions)
        self.model.reserve_positions(self.positions)
        # greedy and beam search on static key/value buffers, each step a replayed CUDA graph: by default with the
        # cuda backend on a GPU (a step there is hundreds of small kernel launches), never on a CPU unless asked
        use_graphs = static_decoding_by_default(self.model) if graphs is None else graphs
        self.graphs = (
            GraphedStep(self.model, max_src=self.max_src_tokens + 1, max_len=self.positions) if use_graphs else None
        )

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str = "float32",
        threads: int = 0,
        weights: str | None = None,
        ops: str = "auto",
        graphs: bool | None = None,
    ) -> Translator:
        return cls.from_checkpoints(
            [path], device=device, dtype=dtype, threads=threads, weights=weights, ops=ops, graphs=graphs
        )

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[str | os.PathLike],
        *,
        device: str = "auto",
        dtype: str = "float32",
        threads: int = 0,
        weights: str | None = None,
        ops: str = "auto",
        graphs: bool | None = None,
    ) -> Translator:
        """One checkpoint, or several decoded as an ensemble (mean of their probabilities at every
        step); an ensemble's members must share the tokenizers. Decoding defaults come from the first.
        `weights`: "ema", "raw" or None (each checkpoint's EMA weights when it has them; checkpoint.model_weights).
        `ops`: the backend the models compute with (model.choose_ops: auto, reference, cpu or cuda).
        `graphs`: search on static buffers with CUDA graphs (None: with the cuda backend on a GPU)."""
        if not paths:
            raise TranslateError("give at least one checkpoint (-c FILE)")
        dev = runtime.pick_device(device)
        torch_dtype = runtime.check_dtype(dtype, dev)
        runtime.set_threads(threads)
        runtime.reuse_freed_memory()  # every search step allocates the same tensors again
        members: list[CheckpointModel] = []
        models = []
        for path in paths:
            member = model_from_checkpoint(path, weights=weights, tokenizers_of=members[0] if members else None)
            # Inference in reduced precision: cast the weights once (cheaper per step than autocast); LayerNorm
            # and the sinusoid table stay float32 (Transformer.cast_weights).
            cast = member.model.to(dev).cast_weights(torch_dtype)
            models.append(cast.use_ops(choose_ops(ops, dev)))  # the backend for this device
            members.append(member)
        first = members[0]  # its tokenizers serve every member (loaded once); its decode settings are the defaults
        max_src = min(m.cfg.model.max_positions for m in members) - 1
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(
            model,
            first.src_tok,
            first.tgt_tok,
            first.cfg,
            device=dev,
            max_src_tokens=max_src,
            source=first.source,
            graphs=graphs,
        )

    @property
    def languages(self) -> list[str]:
        """The target languages the model translates into (its config's data.corpora), in order; several: a
        multilingual model, which :meth:`translate` asks for one with ``tgt_lang``; none: not stated."""
        return self.cfg.model.decoder_languages.split() or target_languages(self.cfg.data)

    @property
    def num_parameters(self) -> int:
        """The model's parameters (an ensemble's: all members'), each shared matrix counted once."""
        return sum(p.numel() for p in self.model.parameters())

    def decode_defaults(self, beam: int | None = None, lenpen: float | None = None) -> tuple[int, float]:
        """``beam`` and ``lenpen``, each the checkpoint's ``decode`` setting when None. The checkpoint's beam is
        checked here against the pieces its model can output (its target vocabulary, or the kept pieces of
        ``model.restrict_output``), so that a default too wide is refused naming the checkpoint, not a flag."""
        d = self.cfg.decode
        if beam is None:
            outputs = self.model.output_size if isinstance(self.model, Transformer) else self.tgt_tok.vocab_size
            problem = beam_problem(d.beam, tgt_vocab_size=min(outputs, self.tgt_tok.vocab_size))
            if problem:
                raise TranslateError(
                    f"{self.source}: its decode.beam={d.beam} {problem.reason}; give a beam that fits (--beam)"
                )
        return (d.beam if beam is None else beam), (d.lenpen if lenpen is None else lenpen)

    # a str is also a Sequence[str]; this overload comes first
    @overload
    def translate(  # type: ignore[overload-overlap]
        self,
        lines: str,
        beam: int | None = None,
        lenpen: float | None = None,
        nbest: int = 1,
        *,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        epsilon: float | None = None,
        seed: int | None = None,
    ) -> Translation: ...
    @overload
    def translate(
        self,
        lines: Sequence[str],
        beam: int | None = None,
        lenpen: float | None = None,
        nbest: int = 1,
        *,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        epsilon: float | None = None,
        seed: int | None = None,
    ) -> list[Translation]: ...
    def translate(
        self,
        lines: str | Sequence[str],
        beam: int | None = None,
        lenpen: float | None = None,
        nbest: int = 1,
        *,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        epsilon: float | None = None,
        seed: int | None = None,
    ) -> Translation | list[Translation]:
        """Translations of ``lines``, in order: one ``str`` per line when ``nbest`` is 1, else one n-best list of
        ``(score, text)`` per line, best first. A single ``str`` gives a single result. ``beam`` and ``lenpen``
        default to the checkpoint's decode settings; the text rules are ``tmt translate``'s (an empty line
        gives an empty translation, a line over the model's length is truncated). For the stats (lines
        truncated, tokens, seconds) and the batch size, use :meth:`translate_batch`.

        ``tgt_lang`` asks a multilingual model (several :attr:`languages`) for one of them: every source starts with
        its tag, ``<2fr>``; a model with one target language takes that one or None, a model with none stated only
        None (:func:`~transformer_mt.text.language_tags` words the refusals, one line each). An NLLB model
        (``model.decoder_languages``) takes both ``src_lang`` and ``tgt_lang``: the source starts with the source
        language's code, the decoder's input with [start, the target language's code].

        ``sample=True`` (default: the checkpoint's ``decode.sample``) draws ``nbest`` samples per line instead of
        searching, with ``temperature``, ``top_k``, ``top_p``, ``epsilon`` and ``seed`` (each the checkpoint's
        ``decode`` setting when not given; :func:`~transformer_mt.decoding.sampling.sampling_request` says what is
        refused), each line's samples seeded by (``seed``, its index in ``lines``)."""
        if self.cfg.model.decoder_languages:  # NLLB: the source's language on the source, the target's on the decoder
            src_prefix, tgt_prefix = decoder_language_ids(
                self.cfg.model, self.tgt_tok, tgt_lang, src_lang, where=self.source
            )
            tags: list[str] = []
        else:
            if src_lang is not None:
                raise LanguageError(
                    f"src_lang {src_lang[:40]}: {self.source} reads no source language (only an NLLB / M2M100 "
                    "model's sources start with their language's code); leave it out"
                )
            src_prefix, tgt_prefix = [], []
            tags = language_tags(self.cfg.data, self.src_tok, tgt_lang, where=self.source)  # before any work
        chosen = sampling_request(
            self.cfg.decode,
            sample=sample,
            beam=beam,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            epsilon=epsilon,
            seed=seed,
        )
        beam, lenpen = self.decode_defaults(1 if chosen is not None and beam is None else beam, lenpen)
        batch = tagged([lines] if isinstance(lines, str) else list(lines), tags)
        hypotheses = self.translate_batch(
            batch, beam=beam, lenpen=lenpen, nbest=nbest, sampling=chosen, src_prefix=src_prefix, tgt_prefix=tgt_prefix
        ).hypotheses
        out: list[Translation] = [nb[0][1] for nb in hypotheses] if nbest == 1 else list(hypotheses)
        return out[0] if isinstance(lines, str) else out

    def translate_batch(
        self,
        lines: list[str],
        *,
        beam: int,
        lenpen: float,
        nbest: int = 1,
        batch_tokens: int | None = None,
        max_len_a: float | None = None,
        max_len_b: int | None = None,
        max_output_tokens: int | None = None,
        scores: bool = True,  # noqa: ARG002 - the search ranks by the scores, so they come at no extra cost
        sampling: Sampling | None = None,
        src_prefix: Sequence[int] = (),
        tgt_prefix: Sequence[int] = (),
    ) -> TranslationResult:
        """n-best (score, text) lists, one per input line, in input order (empty lines give [(0.0, "")] * nbest),
        and this call's stats. ``max_len_a`` / ``max_len_b`` override the checkpoint's decode settings
        within the positions sized at load time; ``max_output_tokens`` caps every line's output below them
        (a server's limit: a line whose own limit is shorter keeps it). ``sampling``: ``nbest`` samples per line
        instead of a search (beam 1), line i's seeded by (``sampling.seed``, ``sampling.first_line`` + i).
        ``src_prefix`` / ``tgt_prefix``: ids every source starts with, and the decoder's forced start after its start
        id (an NLLB model's language codes, :func:`~transformer_mt.decoding.prefix.decoder_language_ids`)."""
        # before encoding: --beam 100000 must not allocate first
        a, b = checked_request(
            self,
            beam=beam,
            nbest=nbest,
            lenpen=lenpen,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            max_output_tokens=max_output_tokens,
            positions=self.positions,
            sample=sampling is not None,
        )
        tic = time.perf_counter()
        # an NLLB model's source code takes a position too: the pieces are cut to what is left
        limit = self.max_src_tokens - len(src_prefix)
        keep, ids, truncated = encode_sources(self.src_tok, lines, max_src_tokens=limit)
        ids = [[*src_prefix, *seq] for seq in ids] if src_prefix else ids
        hyps = translate_ids(
            self.model,
            ids,
            beam=beam,
            lenpen=lenpen,
            nbest=nbest,
            max_len_a=a,
            max_len_b=b,
            batch_tokens=batch_tokens or self.cfg.decode.batch_tokens,
            device=self.device,
            dtype="float32",
            max_output=max_output_tokens,
            sampling=sampling,
            lines=keep,
            graphs=self.graphs,
            prefix=tgt_prefix,
        )
        out: list[list[tuple[float, str]]] = [[(0.0, "")] * nbest for _ in lines]
        tgt_tokens = 0
        for i, nb in zip(keep, hyps):
            texts = self.tgt_tok.decode([h.tokens for h in nb])
            out[i] = [(h.score, t) for h, t in zip(nb, texts)]
            tgt_tokens += len(nb[0].tokens) + 1  # + EOS, as fairseq counts
        stats = TranslateStats(
            lines=len(lines),
            truncated=truncated,
            tgt_tokens=tgt_tokens,
            seconds=time.perf_counter() - tic,
            max_src_tokens=self.max_src_tokens,
        )
        return TranslationResult(out, stats)


class LanguageTranslator:
    """A :class:`~transformer_mt.decoding.results.TextTranslator` (tmt's Translator, the CTranslate2 engine) asked
    for one target language: its sources start with the language's tag (:func:`~transformer_mt.text.tagged`; none
    for a model with one target language). The language is checked when it is built, naming ``option``
    (``--tgt-lang``), so a command refuses it before reading any input. What `tmt translate` and `tmt evaluate`
    translate through. An NLLB model (``model.decoder_languages``, tmt's Translator only) takes ``src_lang`` too:
    its sources start with that language's code and its decoder with the target's, as :meth:`Translator.translate`
    puts them."""

    def __init__(
        self,
        translator: TextTranslator,
        tgt_lang: str | None,
        *,
        where: str,
        option: str = "tgt_lang",
        src_lang: str | None = None,
    ):
        self.translator = translator
        self.nllb: tuple[Translator, list[int], list[int]] | None = None  # the translator, source and decoder prefix
        if translator.cfg.model.decoder_languages:
            if not isinstance(translator, Translator):
                raise TranslateError(
                    f"{where}: an NLLB model names its target language on the decoder, which only tmt's engine "
                    "decodes; use --engine tmt"
                )
            src, tgt = decoder_language_ids(translator.cfg.model, translator.tgt_tok, tgt_lang, src_lang, where=where)
            self.nllb, self.tags = (translator, src, tgt), []
        else:
            if src_lang is not None:
                raise LanguageError(
                    f"{option.replace('tgt', 'src')} {src_lang[:40]}: {where} reads no source language (only an NLLB / "
                    f"M2M100 model's sources start with their language's code); leave it out"
                )
            self.tags = language_tags(translator.cfg.data, translator.src_tok, tgt_lang, where=where, option=option)
        self.cfg, self.src_tok, self.tgt_tok = translator.cfg, translator.src_tok, translator.tgt_tok
        self.max_src_tokens = translator.max_src_tokens

    @property
    def num_parameters(self) -> int:
        return self.translator.num_parameters

    def decode_defaults(self, beam: int | None = None, lenpen: float | None = None) -> tuple[int, float]:
        return self.translator.decode_defaults(beam, lenpen)

    def translate_batch(self, lines: list[str], **settings: Any) -> TranslationResult:
        """The translator's ``translate_batch`` of the tagged lines, every setting passed on as given."""
        if self.nllb is not None:
            translator, src, tgt = self.nllb
            return translator.translate_batch(lines, **settings, src_prefix=src, tgt_prefix=tgt)
        return self.translator.translate_batch(tagged(lines, self.tags), **settings)


def load(
    path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    device: str = "auto",
    dtype: str = "float32",
    threads: int = 0,
    weights: str | None = None,
    ops: str = "auto",
) -> Translator:
    """A :class:`Translator` for one checkpoint, or for a list of them decoded as an ensemble
    (:meth:`Translator.from_checkpoints`): ``transformer_mt.load("checkpoint_best.pt").translate(["A man."])``.
    ``device``: auto, cpu, cuda, cuda:N or mps; ``dtype``: float32, bfloat16 or float16 (GPU); ``threads``: CPU
    threads (0 = torch's default); ``weights``: ema, raw or None (the EMA weights when a checkpoint has them);
    ``ops``: the backend the model computes with, auto (the device's), reference, cpu or cuda. Sets the process's
    environment defaults first (runtime.set_environment_defaults), as the tmt command does."""
    runtime.set_environment_defaults()
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    return Translator.from_checkpoints(paths, device=device, dtype=dtype, threads=threads, weights=weights, ops=ops)
