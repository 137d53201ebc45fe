"""The served models: each a translator (tmt's ``Translator``, or any :class:`~transformer_mt.decoding.TextTranslator`
the command line built, such as the CTranslate2 engine), the calls its worker makes (:class:`Runner`) and its Batcher.

The Runner is what runs on the worker thread, never on the event loop: measuring a request (tokenizing
it, for batch sizes and the truncation warnings) and translating a batch under the server's output cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer_mt import runtime
from transformer_mt.decoding import TextTranslator, Translator
from transformer_mt.serve.batching import Batcher, BatchEvents, TranslateFn
from transformer_mt.serve.errors import ServeError
from transformer_mt.serve.options import ServeOptions


class Runner:
    """One translator's work for the batcher: ``prepare`` and ``translate`` (see batching.PrepareFn, TranslateFn)."""

    def __init__(self, tr: TextTranslator, *, max_output_tokens: int = 0):
        self.tr, self.cap = tr, max_output_tokens
        self.events = BatchEvents()  # the app's metrics replace it: target tokens are counted here

    def prepare(self, lines: list[str]) -> tuple[list[int], list[str]]:
        """Source tokens per line (pieces + EOS, 0 for a blank line, as the Translator counts after truncation)
        and one warning per line the Translator will truncate (as `tmt translate` does)."""
        limit = self.tr.max_src_tokens
        tokens, warnings = [], []
        for i, (pieces, line) in enumerate(zip(self.tr.src_tok.encode(lines), lines)):
            if not line.strip():
                tokens.append(0)
                continue
            if len(pieces) > limit:
                warnings.append(
                    f"text[{i}]: {len(pieces)} pieces, truncated to {limit} (model.max_positions={limit + 1})"
                )
            tokens.append(min(len(pieces), limit) + 1)
        return tokens, warnings

    def translate(
        self,
        lines: list[str],
        *,
        beam: int,
        lenpen: float,
        nbest: int,
        src_prefix: Sequence[int] = (),
        tgt_prefix: Sequence[int] = (),
    ) -> list:
        """n-best lists, one per line, in order. With ``max_output_tokens``, no line's output is longer than the
        cap; a line whose checkpoint limit (decode.max_len_a x source + max_len_b) is shorter keeps it, so its
        translation is the Translator's own. ``src_prefix`` / ``tgt_prefix``: an NLLB model's language codes
        (Translator.translate_batch; given only to tmt's Translator)."""
        # an answer carries scores only with n-best lists (one best is sent as text)
        cap, scores = self.cap or None, nbest > 1
        if src_prefix or tgt_prefix:
            if not isinstance(self.tr, Translator):  # the request's checks refused it: schema.language_codes
                raise ServeError("an NLLB model's language codes need tmt's Translator")
            result = self.tr.translate_batch(
                lines,
                beam=beam,
                lenpen=lenpen,
                nbest=nbest,
                max_output_tokens=cap,
                scores=scores,
                src_prefix=src_prefix,
                tgt_prefix=tgt_prefix,
            )
        else:
            result = self.tr.translate_batch(
                lines, beam=beam, lenpen=lenpen, nbest=nbest, max_output_tokens=cap, scores=scores
            )
        self.events.generated(result.stats.tgt_tokens)
        return result.hypotheses


@dataclass
class ServedModel:
    """One checkpoint being served: its name, where it came from (never shown to clients), translator and batch
    queue."""

    name: str
    path: str
    translator: TextTranslator
    batcher: Batcher
    runner: Runner | None = None


def serve_model(
    name: str,
    translator: TextTranslator,
    options: ServeOptions,
    *,
    path: str = "",
    translate: TranslateFn | None = None,
    threads: int = 0,
) -> ServedModel:
    """A ServedModel with its batcher started; ``translate`` replaces the Runner's (tests instrument it). ``threads``:
    torch's CPU threads on the worker thread that decodes (0: as set for the calling thread)."""
    runner = Runner(translator, max_output_tokens=options.max_output_tokens)
    batcher = Batcher(
        translate or runner.translate,
        name=name,
        max_queue=options.max_queue,
        batch_tokens=options.batch_tokens or translator.cfg.decode.batch_tokens,
        wait_s=options.batch_wait_ms / 1000,
        prepare=runner.prepare,
        on_start=(lambda: runtime.set_threads(threads)) if threads else None,
    )
    return ServedModel(name, path, translator, batcher, runner)


def load_models(
    specs: list[str],
    *,
    device: str,
    threads: int,
    options: ServeOptions,
    load: Callable[[str], TextTranslator] | None = None,
) -> list[ServedModel]:
    """``PATH`` or ``NAME=PATH`` per checkpoint; a name defaults to the file's stem and must be unique. ``load`` builds
    the translator of a path (None: tmt's ``Translator`` on ``device``)."""
    named: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():  # a path that itself holds "=" stays a path
            name, path = Path(spec).stem, spec
        if name in (n for n, _ in named):
            raise ServeError(f"-c {spec}: a model named {name!r} is already served; name them apart with -c NAME=PATH")
        named.append((name, path))
    # ``threads`` goes to each model's worker thread, the one that decodes (torch's CPU threads are per thread)
    load = load or (lambda path: Translator.from_checkpoint(path, device=device))
    return [serve_model(name, load(path), options, path=path, threads=threads) for name, path in named]
