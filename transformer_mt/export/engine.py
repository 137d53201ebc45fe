"""``--engine ctranslate2``: a checkpoint decoded by CTranslate2 behind tmt's translator interface
(:class:`~transformer_mt.decoding.TextTranslator`), so `tmt translate`, `tmt evaluate` and `tmt serve` use it as they
use tmt's own ``Translator``.

tmt's text rules stay tmt's: an empty line gives an empty translation and is not decoded; a source longer than
``model.max_positions - 1`` pieces is truncated and counted; n-best lists are best first. CTranslate2 is called as
its users call it: one ``translate_batch`` over all the lines of a call, batched by source tokens (``batch_tokens``,
the checkpoint's ``decode.batch_tokens``), on ``threads`` intra-op threads.

What maps exactly, and what does not (docs/deploying.md has the measured rates):

- Output length. tmt's longest output is floor(a * n + b) per sentence (n = pieces + EOS, and at most the server's
  cap); CTranslate2 takes one ``max_decoding_length`` per call, so it gets the batch's largest. Greedy search
  decodes each token from the prefix alone, so an output past its own limit is cut to it: exactly tmt's. Beam
  search's choice depends on the limit (at the limit tmt finishes the open beams as they are), so a sentence whose
  beam output passes its own limit is decoded again, with its limit, in one more call per distinct limit. A
  sentence whose limit would have made a cut-off open beam win, although the longer search found a shorter
  hypothesis, keeps that shorter one.
- Length penalty. CTranslate2 divides a log-probability by len^alpha, len without EOS, and with a penalty it stops
  a sentence once ``beam`` hypotheses finished; tmt divides by GNMT's ((5 + len) / 6)^alpha, len with EOS, and
  searches until no open beam can beat its worst finished one. At lenpen 0 both rank by log-probability and the
  best hypothesis is tmt's (greedy: at any lenpen, since the penalty only rescales its score). At lenpen != 0,
  and for n-best lists, CTranslate2 returns ``beam`` hypotheses at length penalty 0 and they are re-ranked here
  with tmt's GNMT penalty: the best of them, which is not always the hypothesis tmt's longer search finds.
- Padding and the decoder's start (BOS) are never generated, as in tmt: the cached conversion gives them an output
  bias of -1e9, which removes them before CTranslate2's softmax, so the other ids' log-probabilities rise by
  -log(1 - p(pad) - p(BOS)), where tmt masks them after its softmax and leaves the others as they are: nothing
  for a trained model (those probabilities are next to 0), enough to reorder the beams of an untrained one.
- Scores are CTranslate2's summed log-probabilities (its kernels differ from torch's in the last digits) divided by
  tmt's penalty; a greedy output cut to its limit is scored by CTranslate2's ``score_batch`` over the kept tokens.
- Sampling (``sampling``): CTranslate2's ``sampling_temperature``, ``sampling_topk`` (0: every token) and
  ``sampling_topp``, measured as tmt measures them (top_p on what top_k left, renormalised; the nucleus the fewest
  tokens reaching p), ``num_hypotheses`` = ``nbest`` independent samples, each cut to its sentence's limit as a
  greedy output is. Epsilon sampling is not CTranslate2's, and is refused. The draws are CTranslate2's own:
  ``ctranslate2.set_random_seed`` is called with the seed (and the call's first line) before each call, and a
  decoding thread of CTranslate2 4.x seeds its generator at its first draw only, so that a run (``tmt translate``: one
  engine, its chunks in order) is reproduced by the same seed, input, batch size and threads, but a line's samples
  depend on the batches and the lines around it, unlike tmt's own (one generator per line and sample).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer_mt.config import Config, from_dict
from transformer_mt.decoding import (
    Sampling,
    TranslateStats,
    TranslationResult,
    checked_request,
    length_penalty,
    max_output_length,
    mixed_seed,
    positions_needed,
)
from transformer_mt.export.cache import CachedModel, cached_model
from transformer_mt.export.ctranslate2 import JOINT_SPM, SOURCE_SPM, TARGET_SPM, require_ctranslate2
from transformer_mt.export.errors import ExportError
from transformer_mt.text import SpecialIds, Tokenizer

ENGINES = ("tmt", "ctranslate2")
Hyp = tuple[float, list[str]]  # (score, target pieces without EOS)


class CTranslate2Translator:
    """A checkpoint's CTranslate2 model (converted once, :mod:`~transformer_mt.export.cache`), its tokenizers and
    decode settings; ``translate_batch`` as ``Translator.translate_batch``. Read-only once built."""

    def __init__(self, cached: CachedModel, *, device: str = "cpu", compute_type: str = "float32", threads: int = 1):
        ct2 = require_ctranslate2()
        notes = cached.notes
        self.cfg: Config = from_dict(notes["config"], source=str(cached.path / "tmt_export.json"))
        self.src_tok, self.tgt_tok = _tokenizers(cached.path, self.cfg, vocab_ids=notes["vocab_ids"])
        self.num_parameters: int = notes["parameters"]
        self.max_src_tokens = self.cfg.model.max_positions - 1  # EOS takes one place, as in Translator
        d = self.cfg.decode
        self.positions = positions_needed(
            self.max_src_tokens + 1, max_len_a=d.max_len_a, max_len_b=d.max_len_b
        )  # the exported table
        self.model_dir, self.compute_type, self.threads, self.note = cached.path, compute_type, threads, cached.note
        self.eos = self.tgt_tok.id_to_piece(self.cfg.model.eos_id)
        self.ct = ct2.Translator(
            str(cached.path), device=device, compute_type=compute_type, intra_threads=threads, inter_threads=1
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
        compute_type: str = "float32",
    ) -> CTranslate2Translator:
        """The engine for one checkpoint; every option CTranslate2 cannot honour is refused in one line."""
        ct2 = require_ctranslate2()
        if len(paths) != 1:
            raise ExportError(
                f"--engine ctranslate2 decodes one checkpoint, not an ensemble of {len(paths)}; use --engine tmt for "
                "-c given several times"
            )
        if dtype != "float32":
            raise ExportError(
                f"--dtype {dtype} applies to --engine tmt; with --engine ctranslate2 choose the weight type with "
                "--compute-type (e.g. float16, int8)"
            )
        ct2_device = _device(ct2, device)
        supported = sorted(ct2.get_supported_compute_types(ct2_device))
        if compute_type not in (*supported, "auto", "default"):
            raise ExportError(
                f"--compute-type {compute_type}: CTranslate2 on {ct2_device} supports {', '.join(supported)} (or auto)"
            )
        if threads == 0:
            import torch

            threads = torch.get_num_threads()  # tmt's --threads 0: torch's default, the same count for both engines
        return cls(
            cached_model(paths[0], weights=weights), device=ct2_device, compute_type=compute_type, threads=threads
        )

    def decode_defaults(self, beam: int | None = None, lenpen: float | None = None) -> tuple[int, float]:
        """``beam`` and ``lenpen``, each the checkpoint's ``decode`` setting when None."""
        d = self.cfg.decode
        return (d.beam if beam is None else beam), (d.lenpen if lenpen is None else lenpen)

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
        scores: bool = True,
        sampling: Sampling | None = None,
    ) -> TranslationResult:
        """n-best (score, text) lists, one per input line, in input order (empty lines give [(0.0, "")] * nbest),
        and this call's stats: ``Translator.translate_batch``'s contract, decoded by CTranslate2. ``scores=False``
        (one best, text alone): CTranslate2 skips the log-softmax that only the scores need, a greedy output past
        its limit is cut without being scored again, and every score is NaN. ``sampling``: CTranslate2's sampling
        (the module's docstring); epsilon is refused."""
        if sampling is not None and sampling.epsilon > 0:
            raise ExportError(
                f"--epsilon {sampling.epsilon:g}: CTranslate2 has no epsilon sampling; use --engine tmt, or --top-p"
            )
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
        keep = [i for i, line in enumerate(lines) if line.strip()]
        # sentencepiece on this thread: its own threads would start per call and wait for CTranslate2's, still spinning
        pieces = self.src_tok.encode_pieces([lines[i] for i in keep], num_threads=1) if keep else []
        truncated = sum(len(p) > self.max_src_tokens for p in pieces)
        if truncated:
            pieces = [p[: self.max_src_tokens] for p in pieces]
        caps = [
            c
            for c in (
                max_output_tokens,
                self.cfg.model.max_positions if self.cfg.model.positions == "learned" else None,
            )
            if c is not None
        ]
        limits = [min(max_output_length(len(p) + 1, max_len_a=a, max_len_b=b), *caps, 1 << 62) for p in pieces]
        hyps = self._search(
            pieces,
            limits,
            beam=beam,
            lenpen=lenpen,
            nbest=nbest,
            batch_tokens=batch_tokens or self.cfg.decode.batch_tokens,
            scores=scores,
            sampling=sampling,
        )
        texts = iter(self.tgt_tok.decode_pieces([h for nb in hyps for _, h in nb], num_threads=1))
        out: list[list[tuple[float, str]]] = [[(0.0, "")] * nbest for _ in lines]
        tgt_tokens = 0
        for i, nb in zip(keep, hyps):
            out[i] = [(score, next(texts)) for score, _ in nb]
            tgt_tokens += len(nb[0][1]) + 1  # + EOS, as fairseq and Translator count
        stats = TranslateStats(len(lines), truncated, tgt_tokens, time.perf_counter() - tic, self.max_src_tokens)
        return TranslationResult(out, stats)

    def _search(
        self,
        pieces: list[list[str]],
        limits: list[int],
        *,
        beam: int,
        lenpen: float,
        nbest: int,
        batch_tokens: int,
        scores: bool,
        sampling: Sampling | None = None,
    ) -> list[list[Hyp]]:
        """Per source, its n-best (score, pieces), best first, each within the source's own limit."""
        if not pieces:
            return []
        if sampling is not None:
            return self._sample(
                pieces, limits, sampling=sampling, lenpen=lenpen, nbest=nbest, batch_tokens=batch_tokens, scores=scores
            )
        rerank = beam > 1 and (lenpen != 0 or nbest > 1)  # CTranslate2's n-best at penalty 0, ranked by tmt's penalty
        options = dict(
            beam_size=beam,
            num_hypotheses=beam if rerank else 1,
            max_batch_size=batch_tokens,
            batch_type="tokens",
            return_scores=scores or rerank,
        )
        found = self._decode(pieces, max(limits), options)
        if beam == 1:
            return self._cut(found, limits, pieces, lenpen=lenpen, scores=scores)
        redo: dict[int, list[int]] = {}  # own limit -> the sources whose beam output passed it
        for i, (nb, limit) in enumerate(zip(found, limits)):
            if any(len(h) > limit for h, _ in nb):
                redo.setdefault(limit, []).append(i)
        for limit, idx in redo.items():
            for i, nb in zip(idx, self._decode([pieces[i] for i in idx], limit, options)):
                found[i] = nb
        return [self._ranked(nb, lenpen=lenpen, nbest=nbest) for nb in found]

    def _sample(
        self,
        pieces: list[list[str]],
        limits: list[int],
        *,
        sampling: Sampling,
        lenpen: float,
        nbest: int,
        batch_tokens: int,
        scores: bool,
    ) -> list[list[Hyp]]:
        """``nbest`` samples per source by CTranslate2's sampler, each cut to its source's limit (a sample's first
        tokens do not depend on the longest output allowed), best score first."""
        options = dict(
            beam_size=1,
            num_hypotheses=nbest,
            sampling_topk=sampling.top_k,  # 0: every token, as tmt's top_k 0
            sampling_topp=sampling.top_p,
            sampling_temperature=sampling.temperature,
            max_batch_size=batch_tokens,
            batch_type="tokens",
            return_scores=scores or nbest > 1,  # the samples are listed best first
        )
        # one seed per call, from the seed and the call's first line: a CTranslate2 that honours a new seed at every
        # call then gives each chunk of a stream its own draws
        # (0xFFFFFFFF is CTranslate2's "no seed": a seed from the device instead)
        require_ctranslate2().set_random_seed(mixed_seed(sampling.seed, sampling.first_line, 0) % 0xFFFFFFFF)
        found = self._decode(pieces, max(limits), options)
        return self._cut(found, limits, pieces, lenpen=lenpen, scores=scores or nbest > 1)

    def _decode(
        self, pieces: list[list[str]], max_length: int, options: dict[str, Any]
    ) -> list[list[tuple[list[str], float]]]:
        """One ``translate_batch`` call: per source, (pieces ending in EOS when it finished, summed log-prob)."""
        results = self.ct.translate_batch(
            pieces,
            **options,
            length_penalty=0.0,  # the plain log-probability; tmt's penalty is applied here
            max_decoding_length=max_length,
            min_decoding_length=0,  # tmt lets EOS come first (an empty translation)
            max_input_length=0,  # truncated above, to tmt's limit
            return_end_token=True,  # tells a finished hypothesis from one cut at the length limit
        )
        return [list(zip(r.hypotheses, r.scores or [math.nan] * len(r.hypotheses))) for r in results]

    def _ranked(self, nb: list[tuple[list[str], float]], *, lenpen: float, nbest: int) -> list[Hyp]:
        """The best ``nbest`` by tmt's score, logprob / ((5 + len) / 6) ** lenpen; len counts EOS when the hypothesis
        has one (``return_end_token`` keeps it in the list), as tmt's search does."""
        scored = [(logprob / length_penalty(len(h), lenpen), _text_pieces(h, self.eos)) for h, logprob in nb]
        scored.sort(key=lambda s: -s[0])  # stable: equal scores keep CTranslate2's order
        return scored[:nbest]

    def _cut(
        self,
        found: list[list[tuple[list[str], float]]],
        limits: list[int],
        sources: list[list[str]],
        *,
        lenpen: float,
        scores: bool,
    ) -> list[list[Hyp]]:
        """Greedy outputs, or samples, within their limits: their first ``limit`` tokens do not depend on the limit,
        so an output past it is cut to it (no EOS left: tmt finishes it as it is) and, with ``scores``, scored again,
        all in one call; a source's several samples are then listed best score first."""
        hyps = [list(nb) for nb in found]
        cut = [
            (i, k) for i, (nb, limit) in enumerate(zip(found, limits)) for k, (h, _) in enumerate(nb) if len(h) > limit
        ]
        if cut and not scores:
            for i, k in cut:
                hyps[i][k] = (hyps[i][k][0][: limits[i]], math.nan)
        elif cut:
            kept = [hyps[i][k][0][: limits[i]] for i, k in cut]
            scored = self.ct.score_batch([sources[i] for i, _ in cut], kept, max_input_length=0)
            for (i, k), tokens, result in zip(cut, kept, scored):
                hyps[i][k] = (tokens, sum(result.log_probs[: len(tokens)]))  # its log_probs end with EOS's, not kept
        ranked = [
            [(logprob / length_penalty(len(t), lenpen), _text_pieces(t, self.eos)) for t, logprob in nb] for nb in hyps
        ]
        for nb in ranked:
            if len(nb) > 1:
                nb.sort(key=lambda s: -s[0])  # stable: equal scores keep CTranslate2's order
        return ranked


def ctranslate2_translator(
    checkpoints: Sequence[str | os.PathLike],
    *,
    device: str = "auto",
    dtype: str = "float32",
    threads: int = 0,
    weights: str | None = None,
    compute_type: str = "float32",
) -> CTranslate2Translator:
    """``--engine ctranslate2``: the checkpoint converted once (cached beside it) and decoded by CTranslate2, behind
    ``Translator``'s interface; ``compute_type`` is CTranslate2's (float32, int8, int8_float32, ...)."""
    return CTranslate2Translator.from_checkpoints(
        checkpoints, device=device, dtype=dtype, threads=threads, weights=weights, compute_type=compute_type
    )


def _text_pieces(tokens: list[str], eos: str) -> list[str]:
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def _device(ct2, device: str) -> str:
    """tmt's --device as CTranslate2's: cpu, or cuda where this CTranslate2 sees a GPU."""
    gpus = ct2.get_cuda_device_count()
    if device == "auto":
        return "cuda" if gpus else "cpu"
    if device == "cpu" or (device.split(":")[0] == "cuda" and gpus):
        if ":" in device:
            raise ExportError(
                f"--device {device}: --engine ctranslate2 takes cpu or cuda (the first GPU; CUDA_VISIBLE_DEVICES picks "
                "it)"
            )
        return device
    if device.split(":")[0] == "cuda":
        raise ExportError(
            f"--device {device}: this CTranslate2 build sees no CUDA device; use --device cpu, or --engine tmt"
        )
    raise ExportError(f"--device {device}: --engine ctranslate2 runs on cpu or cuda; use one of them, or --engine tmt")


def _tokenizers(model_dir: Path, cfg: Config, *, vocab_ids: list[bool]) -> tuple[Tokenizer, Tokenizer]:
    """The source and target tokenizers of a converted model: its sentencepiece model(s), and for a side whose ids
    come from a vocabulary (an imported MarianMT model) the pieces CTranslate2's vocabulary file lists in id order."""
    specials = SpecialIds.of(cfg.model)
    joint = (model_dir / JOINT_SPM).is_file()
    made: list[Tokenizer] = []
    for side, spm, has_vocab in zip(("source", "target"), (SOURCE_SPM, TARGET_SPM), vocab_ids):
        proto = (model_dir / (JOINT_SPM if joint else spm)).read_bytes()
        vocab = None
        if has_vocab:
            shared = model_dir / "shared_vocabulary.json"
            vocab = json.loads(
                (shared if shared.is_file() else model_dir / f"{side}_vocabulary.json").read_text(encoding="utf-8")
            )
        if made and joint and proto == made[0].proto and vocab == made[0].vocab:
            made.append(made[0])
        else:
            made.append(Tokenizer(proto, vocab=vocab, specials=specials))
    return made[0], made[1]
