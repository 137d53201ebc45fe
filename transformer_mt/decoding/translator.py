"""Translating lists, files and streams in input order: one output line per input line.

`translate_ids` is the batched core (sort by length, batch by source tokens, search, restore
order); `Translator` adds the checkpoint, the tokenizers and the text rules:
- an empty or whitespace-only input line gives an empty output line (the model is not run);
- a line longer than the model allows is truncated, and one warning line counts them;
- n-best output is `INDEX<TAB>SCORE<TAB>TEXT`, K lines per input line, INDEX 0-based, best first.

`load` (``transformer_mt.load``) builds a `Translator` from checkpoints. Its two ways to translate:
`translate(lines, beam=None, lenpen=None, nbest=1)`, the Python API (the checkpoint's decode settings by
default, plain texts back), and `translate_batch`, what the CLI, the server and the evaluation call (every
setting explicit, n-best lists and this call's `TranslateStats` back).

A `Translator` is read-only once built: each call returns its own translations and stats, and the
model's position table is sized when loading, so decoding never changes the model. Several threads may
translate through one Translator at once (the HTTP server does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TextIO, overload

import torch

from transformer_mt import runtime
from transformer_mt.checkpoint import (
    config_from_checkpoint,
    load_checkpoint,
    model_weights,
    tokenizers_from_checkpoint,
    unpack_tokenizers,
    unpack_vocabularies,
)
from transformer_mt.config import Config, beam_problem, length_problem, lenpen_problem
from transformer_mt.data import source_tensor
from transformer_mt.decoding.greedy import greedy_search_batches
from transformer_mt.decoding.lengths import positions_needed
from transformer_mt.decoding.protocol import Hypothesis, SearchError, TextTranslator
from transformer_mt.decoding.rebuild import MAX_POSITION_TABLE_BYTES, rebuild_model
from transformer_mt.decoding.search import search
from transformer_mt.errors import TmtError
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.text import SpecialIds, Tokenizer


class TranslateError(TmtError, ValueError):
    """A translation problem worded for the user."""


class CheckpointModel(NamedTuple):
    """The model a checkpoint holds, rebuilt on the CPU in float32, with its config and tokenizers."""

    model: Transformer
    cfg: Config
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    source: str  # the checkpoint's path, for messages


def model_from_checkpoint(
    path: str | os.PathLike, *, weights: str | None = None, tokenizers_of: CheckpointModel | None = None
) -> CheckpointModel:
    """Rebuild a checkpoint's model with ``weights`` "ema", "raw" or None (its EMA weights when it has them,
    what `tmt translate` decodes with; checkpoint.model_weights). With ``tokenizers_of`` (an ensemble's first
    member), the checkpoint must hold the same tokenizers, checked before the model is built, and shares that
    member's. Nothing is allocated for the model before its config, its tokenizers' sizes and its stored tensors
    agree and fit in the file and in memory (:mod:`~transformer_mt.decoding.rebuild`); the tensors are mapped
    from the file, not read, until then."""
    state = load_checkpoint(path, mmap=True)
    cfg = config_from_checkpoint(state, source=str(path))
    if tokenizers_of is None:
        src_tok, tgt_tok = tokenizers_from_checkpoint(state, cfg, source=str(path))
    else:
        src_tok, tgt_tok = tokenizers_of.src_tok, tokenizers_of.tgt_tok
        differ = [
            what
            for what, mine, theirs in (
                ("sentencepiece models", unpack_tokenizers(state, source=str(path)), (src_tok.proto, tgt_tok.proto)),
                ("vocabularies", unpack_vocabularies(state, source=str(path)), (src_tok.vocab, tgt_tok.vocab)),
                ("special ids (model.*_id)", SpecialIds.of(cfg.model), tokenizers_of.model.specials),
            )
            if mine != theirs
        ]
        if differ:
            raise TranslateError(
                f"{path}: its {differ[0]} differ from those of {tokenizers_of.source}; an ensemble needs checkpoints trained with the same tokenizer"
            )
    weights_dict = model_weights(state, weights=weights, source=str(path))
    # the table a Translator sizes for the longest source and output, refused before the model's own is built
    _check_position_table(
        cfg, positions_needed(cfg.model.max_positions, max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b)
    )
    model = rebuild_model(
        cfg.model,
        weights_dict,
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        source=str(path),
        file_bytes=os.path.getsize(path),
    )
    return CheckpointModel(model, cfg, src_tok, tgt_tok, str(path))


def translate_ids(
    model: Transformer | Ensemble,
    src_ids: list[list[int]],
    *,
    beam: int = 4,
    lenpen: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    nbest: int = 1,
    batch_tokens: int = 4096,
    device: torch.device | str = "cpu",
    dtype: str = "float32",
    max_output: int | None = None,
) -> list[list[Hypothesis]]:
    """Translate id sequences (without EOS; it is appended here) and return n-best lists in input order.

    The model's sinusoid table is grown first if this call's longest source or output needs more positions
    (``reserve_positions``), never during decoding (a Translator's model was sized when loading: nothing to do),
    and a model already in eval mode is left in it (only a training model is switched to eval and back).
    """
    device = torch.device(device)
    if src_ids:
        model.reserve_positions(positions_needed(max(map(len, src_ids)) + 1, max_len_a=max_len_a, max_len_b=max_len_b))
    order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]), reverse=True)
    results: list[list[Hypothesis] | None] = [None] * len(src_ids)
    was_training = model.training
    if (
        was_training
    ):  # validation during training; an eval-mode model (a Translator's, shared by threads) stays as it is
        model.eval()
    try:
        with torch.inference_mode(), runtime.autocast(device, dtype):
            chunks = list(_token_batches(order, src_ids, batch_tokens))
            # (B, S) each: pieces + EOS, right-padded
            srcs = [source_tensor([src_ids[i] for i in chunk], specials=model.specials).to(device) for chunk in chunks]
            if beam == 1 and nbest == 1:  # greedy: a batch's last rows go on with the next batch
                found = [
                    [[hyp] for hyp in hyps]
                    for hyps in greedy_search_batches(
                        model,
                        srcs,
                        lenpen=lenpen,
                        max_len_a=max_len_a,
                        max_len_b=max_len_b,
                        max_output=max_output,
                        batch_tokens=batch_tokens,
                    )
                ]
            else:
                found = [
                    search(
                        model,
                        src,
                        beam=beam,
                        lenpen=lenpen,
                        max_len_a=max_len_a,
                        max_len_b=max_len_b,
                        nbest=nbest,
                        max_output=max_output,
                    )
                    for src in srcs
                ]
            for chunk, hyps in zip(chunks, found):
                for i, nbest_list in zip(chunk, hyps):
                    results[i] = nbest_list
    finally:
        if was_training:
            model.train()
    return results  # type: ignore[return-value] # every index is in one chunk: no None is left


def _token_batches(order: list[int], src_ids: list[list[int]], batch_tokens: int) -> Iterator[list[int]]:
    """Consecutive runs of `order` (sorted longest first) whose padded size stays within `batch_tokens`."""
    chunk: list[int] = []
    for i in order:
        width = len(src_ids[chunk[0]]) + 1 if chunk else len(src_ids[i]) + 1
        if chunk and (len(chunk) + 1) * width > batch_tokens:
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


@dataclass(frozen=True)
class TranslateStats:
    """Counts of one ``Translator.translate_batch`` call, or the sum of several (``a + b``), for the end-of-run
    report and the truncation warning."""

    lines: int = 0  # input lines, empty ones included
    truncated: int = 0  # lines cut to max_src_tokens
    tgt_tokens: int = 0  # generated tokens of the best hypotheses, + EOS each (fairseq's count)
    seconds: float = 0.0  # wall time inside translate_batch()
    max_src_tokens: int = 0  # the truncation limit the counts refer to

    def __add__(self, other: TranslateStats) -> TranslateStats:
        return TranslateStats(
            self.lines + other.lines,
            self.truncated + other.truncated,
            self.tgt_tokens + other.tgt_tokens,
            self.seconds + other.seconds,
            max(self.max_src_tokens, other.max_src_tokens),
        )

    def warning(self) -> str | None:
        """One line counting the truncated input lines, or None when there were none."""
        if not self.truncated:
            return None
        s = "s" if self.truncated > 1 else ""
        return (
            f"tmt translate: warning: {self.truncated} input line{s} longer than {self.max_src_tokens} tokens "
            f"(model.max_positions={self.max_src_tokens + 1}) truncated"
        )


class TranslationResult(NamedTuple):
    """What one ``Translator.translate_batch`` call returns; unpacks as ``hypotheses, stats``."""

    hypotheses: list[list[tuple[float, str]]]  # per input line, in input order: n-best (score, text), best first
    stats: TranslateStats  # this call's counts only


Translation = (
    str | list[tuple[float, str]]
)  # Translator.translate's result per line: the text, or with nbest > 1 its n-best (score, text)


def _check_position_table(cfg: Config, positions: int) -> None:
    """Refuse, before allocating it, a sinusoid table (positions x d_model float32) over
    :data:`MAX_POSITION_TABLE_BYTES`: each of model.max_positions, decode.max_len_a and decode.max_len_b
    may be within its bound while together they ask for tens of GB."""
    size = positions * cfg.model.d_model * 4
    if cfg.model.positions == "sinusoidal" and size > MAX_POSITION_TABLE_BYTES:
        m, d = cfg.model, cfg.decode
        raise TranslateError(
            f"model.max_positions={m.max_positions} with decode.max_len_a={d.max_len_a:g} and decode.max_len_b={d.max_len_b} "
            f"need a position table of {positions:,} x {m.d_model} ({size / (1 << 30):.1f} GiB, more than {MAX_POSITION_TABLE_BYTES >> 30} GiB); "
            "lower them in the checkpoint's config (the longest output is max_len_a x source length + max_len_b)"
        )


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
        _check_position_table(cfg, self.positions)
        self.model.reserve_positions(self.positions)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        *,
        device: str = "auto",
        dtype: str = "float32",
        threads: int = 0,
        weights: str | None = None,
    ) -> Translator:
        return cls.from_checkpoints([path], device=device, dtype=dtype, threads=threads, weights=weights)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[str | os.PathLike],
        *,
        device: str = "auto",
        dtype: str = "float32",
        threads: int = 0,
        weights: str | None = None,
    ) -> Translator:
        """One checkpoint, or several decoded as an ensemble (mean of their probabilities at every
        step); an ensemble's members must share the tokenizers. Decoding defaults come from the first.
        `weights`: "ema", "raw" or None (each checkpoint's EMA weights when it has them; checkpoint.model_weights)."""
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
            models.append(member.model.to(dev).cast_weights(torch_dtype))
            members.append(member)
        first = members[0]  # its tokenizers serve every member (loaded once); its decode settings are the defaults
        max_src = min(m.cfg.model.max_positions for m in members) - 1
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(
            model, first.src_tok, first.tgt_tok, first.cfg, device=dev, max_src_tokens=max_src, source=first.source
        )

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
        self, lines: str, beam: int | None = None, lenpen: float | None = None, nbest: int = 1
    ) -> Translation: ...
    @overload
    def translate(
        self, lines: Sequence[str], beam: int | None = None, lenpen: float | None = None, nbest: int = 1
    ) -> list[Translation]: ...
    def translate(
        self, lines: str | Sequence[str], beam: int | None = None, lenpen: float | None = None, nbest: int = 1
    ) -> Translation | list[Translation]:
        """Translations of ``lines``, in order: one ``str`` per line when ``nbest`` is 1, else one n-best list of
        ``(score, text)`` per line, best first. A single ``str`` gives a single result. ``beam`` and ``lenpen``
        default to the checkpoint's decode settings; the text rules are ``tmt translate``'s (an empty line
        gives an empty translation, a line over the model's length is truncated). For the stats (lines
        truncated, tokens, seconds) and the batch size, use :meth:`translate_batch`."""
        beam, lenpen = self.decode_defaults(beam, lenpen)
        batch = [lines] if isinstance(lines, str) else list(lines)
        hypotheses = self.translate_batch(batch, beam=beam, lenpen=lenpen, nbest=nbest).hypotheses
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
    ) -> TranslationResult:
        """n-best (score, text) lists, one per input line, in input order (empty lines give [(0.0, "")] * nbest),
        and this call's stats. ``max_len_a`` / ``max_len_b`` override the checkpoint's decode settings
        within the positions sized at load time; ``max_output_tokens`` caps every line's output below them
        (a server's limit: a line whose own limit is shorter keeps it)."""
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
        )
        tic = time.perf_counter()
        keep = [i for i, line in enumerate(lines) if line.strip()]
        ids = self.src_tok.encode([lines[i] for i in keep])
        truncated = 0
        for n, seq in enumerate(ids):
            if len(seq) > self.max_src_tokens:
                ids[n] = seq[: self.max_src_tokens]
                truncated += 1
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


def checked_request(
    translator: TextTranslator,
    *,
    beam: int,
    nbest: int,
    lenpen: float,
    max_len_a: float | None,
    max_len_b: int | None,
    max_output_tokens: int | None,
    positions: int,
) -> tuple[float, int]:
    """The checks of a ``translate_batch`` call, before anything is encoded (``--beam 100000`` must not allocate
    first), shared by every engine: beam, n-best and length penalty (SearchError); the output length rule and the cap
    (TranslateError), within the ``positions`` the engine was loaded with. Returns the (max_len_a, max_len_b) in force."""
    problem = beam_problem(beam, nbest, tgt_vocab_size=translator.tgt_tok.vocab_size) or lenpen_problem(lenpen)
    if problem:
        raise SearchError(str(problem))
    d = translator.cfg.decode
    a, b = d.max_len_a if max_len_a is None else max_len_a, d.max_len_b if max_len_b is None else max_len_b
    problem = length_problem(a, b)
    if problem:
        raise TranslateError(str(problem))
    if max_output_tokens is not None and max_output_tokens < 1:
        raise TranslateError(f"max_output_tokens={max_output_tokens} must be at least 1 (None: no cap)")
    if positions_needed(translator.max_src_tokens + 1, max_len_a=a, max_len_b=b) > positions:
        raise TranslateError(
            f"max_len_a={a:g} max_len_b={b} allow outputs longer than the {positions} positions the model was loaded "
            f"with (decode.max_len_a={d.max_len_a:g}, decode.max_len_b={d.max_len_b}); lower them"
        )
    return a, b


def load(
    path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    device: str = "auto",
    dtype: str = "float32",
    threads: int = 0,
    weights: str | None = None,
) -> Translator:
    """A :class:`Translator` for one checkpoint, or for a list of them decoded as an ensemble
    (:meth:`Translator.from_checkpoints`): ``transformer_mt.load("checkpoint_best.pt").translate(["A man."])``.
    ``device``: auto, cpu, cuda, cuda:N or mps; ``dtype``: float32, bfloat16 or float16 (GPU); ``threads``: CPU
    threads (0 = torch's default); ``weights``: ema, raw or None (the EMA weights when a checkpoint has them)."""
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    return Translator.from_checkpoints(paths, device=device, dtype=dtype, threads=threads, weights=weights)


def write_results(results: list[list[tuple[float, str]]], out: TextIO, *, nbest: int, first_index: int) -> None:
    for k, nb in enumerate(results):
        if nbest == 1:
            out.write(nb[0][1] + "\n")
        else:
            for score_, text in nb:
                out.write(f"{first_index + k}\t{score_:.4f}\t{text}\n")


def translate_stream(
    translator: TextTranslator,
    lines: Iterable[list[str]],
    out: TextIO,
    *,
    beam: int,
    lenpen: float,
    nbest: int = 1,
    batch_tokens: int | None = None,
    progress=None,
) -> TranslateStats:
    """Translate chunks of lines as they come and write them in order; flushes after each chunk. Returns the
    stats of all chunks together (their ``warning()`` is the end-of-run truncation line)."""
    index, total = 0, TranslateStats(max_src_tokens=translator.max_src_tokens)
    for chunk in lines:
        # one best per line is written as text alone: its score is not asked for
        results, stats = translator.translate_batch(
            chunk, beam=beam, lenpen=lenpen, nbest=nbest, batch_tokens=batch_tokens, scores=nbest > 1
        )
        write_results(results, out, nbest=nbest, first_index=index)
        out.flush()
        index += len(chunk)
        total += stats
        if progress is not None:
            progress.update(len(chunk))
    return total
