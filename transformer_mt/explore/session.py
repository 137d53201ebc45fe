"""What one `tmt explore` process holds: its checkpoints by name, the example sentences, and the request checks.

Checkpoints are shown by name only (``NAME=PATH`` on the command line, or the file's stem), never by their
filesystem path: the page may be opened by someone who should not learn the server's directory layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformer_mt.config import beam_problem, lenpen_problem
from transformer_mt.decoding import Translator
from transformer_mt.errors import TmtError
from transformer_mt.explore.errors import ExploreError
from transformer_mt.model import Transformer
from transformer_mt.text import iter_file, language_tags, tagged

MAX_EXAMPLES = 500  # lines of the examples file offered in the page's menu


class RequestError(ExploreError):
    """A request the explorer refuses: the HTTP status and one line naming the field and the fix."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Limits:
    """What one request may ask for (more: a 4xx answer naming the limit)."""

    max_chars: int = 1000  # characters of the source or reference sentence; more -> 413
    max_beam: int = 16  # largest beam; more -> 422 (the trace lists every hypothesis of every step)
    topk: int = 5  # alternatives shown per target piece, at most
    max_attention: int = 2_000_000  # attention weights in one answer, L x H x (S^2 + T^2 + T*S); more -> 413

    def check(self) -> None:
        for key in ("max_chars", "max_beam", "topk", "max_attention"):
            if getattr(self, key) < 1:
                raise ExploreError(f"--{key.replace('_', '-')} {getattr(self, key)}: must be at least 1")


@dataclass
class Explorer:
    """The loaded checkpoints (first = default), the example sentences and the limits."""

    translators: dict[str, Translator]
    examples: list[str] = field(default_factory=list)
    examples_name: str = ""  # the examples file's name (no directory), for the page's menu
    limits: Limits = field(default_factory=Limits)
    threads: int = 0  # torch's CPU threads for the thread a request runs on (they are per thread); 0 = as it has

    @property
    def default(self) -> str:
        return next(iter(self.translators))

    def translator(self, name: str | None) -> Translator:
        """The checkpoint called ``name`` (None: the first); 404 naming the choices otherwise."""
        if name is None:
            return self.translators[self.default]
        if name not in self.translators:
            raise RequestError(
                404,
                f"checkpoint: {name!r} is not loaded; choose one of {', '.join(map(repr, self.translators))} "
                "(GET /api/checkpoints)",
            )
        return self.translators[name]

    def settings(self, tr: Translator, beam: int | None, lenpen: float | None) -> tuple[int, float]:
        """The request's beam and lenpen (the checkpoint's decode settings when None), checked by the rules
        `tmt translate` and `tmt serve` apply; 422 naming the field otherwise."""
        beam, lenpen = tr.decode_defaults(beam, lenpen)
        vocab = tr.tgt_tok.vocab_size
        problem = beam_problem(beam, 1, tgt_vocab_size=vocab, limit=self.limits.max_beam) or lenpen_problem(lenpen)
        if problem:
            raise RequestError(422, f"{problem.key}: {problem.value} {problem.reason}")
        return beam, lenpen

    def language(self, tr: Translator, tgt_lang: str | None) -> list[str]:
        """The tags a source starts with for the request's ``tgt_lang`` (text.language_tags): 422 naming the field and
        the checkpoint's languages when the model cannot be asked for it (or, multilingual, is asked for none)."""
        name = next(n for n, t in self.translators.items() if t is tr)
        try:
            return language_tags(tr.cfg.data, tr.src_tok, tgt_lang, where=f"checkpoint {name!r}", option="tgt_lang")
        except TmtError as exc:
            raise RequestError(422, str(exc)) from None

    def sentence(self, tr: Translator, text: str, *, field_name: str = "text", tags: Sequence[str] = ()) -> list[int]:
        """The pieces of one sentence, refused when empty (422), a line break or over the limits (413): the page
        shows one sentence whole, so a sentence the model would truncate is refused rather than cut. A source
        starts with ``tags`` (a multilingual model's target language), as the Translator's sources do."""
        if not text.strip():
            raise RequestError(422, f"{field_name}: empty; type a sentence or pick an example")
        if "\n" in text or "\r" in text:
            raise RequestError(422, f"{field_name}: contains a line break; give one sentence")
        if len(text) > self.limits.max_chars:
            raise RequestError(
                413,
                f"{field_name}: {len(text)} characters, more than --max-chars {self.limits.max_chars}; "
                "give a shorter sentence",
            )
        tok = tr.tgt_tok if field_name == "reference" else tr.src_tok
        ids = tok.encode(tagged([text], tags))[0]
        if len(ids) > tr.max_src_tokens:
            raise RequestError(
                413,
                f"{field_name}: {len(ids)} pieces, more than this model's {tr.max_src_tokens} "
                "(model.max_positions - 1); give a shorter sentence",
            )
        return ids


def single_model(tr: Translator) -> Transformer:
    """The Translator's model; the explorer loads each -c on its own, never as an ensemble."""
    if not isinstance(tr.model, Transformer):
        raise ExploreError("tmt explore shows one model at a time; give each checkpoint its own -c")
    return tr.model


def name_checkpoints(specs: list[str]) -> list[tuple[str, str]]:
    """``PATH`` or ``NAME=PATH`` per -c -> (name, path); a name defaults to the file's stem and must be unique."""
    named: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).exists():  # a path that itself holds "=" stays a path
            name, path = Path(spec).stem, spec
        if not name:
            raise ExploreError(f"-c {spec}: the name before '=' is empty; write -c NAME=PATH")
        if name in (n for n, _ in named):
            raise ExploreError(
                f"-c {spec}: a checkpoint named {name!r} is already loaded; name them apart with -c NAME=PATH"
            )
        named.append((name, path))
    return named


def read_examples(path: str | Path | None, *, limit: int = MAX_EXAMPLES) -> list[str]:
    """The first ``limit`` non-empty lines of ``path`` (None: none), read as every tmt command reads text."""
    if path is None:
        return []
    lines = []
    for line in iter_file(path):
        if line.strip():
            lines.append(line)
            if len(lines) == limit:
                break
    return lines


def load_explorer(
    specs: list[str],
    *,
    examples: str | Path | None = None,
    device: str = "cpu",
    threads: int = 0,
    limits: Limits | None = None,
) -> Explorer:
    """Load every checkpoint (``PATH`` or ``NAME=PATH``) and the example sentences of ``examples`` (None: none).

    Only files named on the command line are read: never a path a checkpoint names (its ``data.valid_src``),
    since a checkpoint from someone else could name any file of this machine and the page serves the examples."""
    limits = limits or Limits()
    limits.check()
    if not specs:
        raise ExploreError("give at least one checkpoint (-c FILE)")
    translators = {name: Translator.from_checkpoint(path, device=device) for name, path in name_checkpoints(specs)}
    for name, tr in translators.items():
        if tr.cfg.model.decoder_languages:  # its pages put no codes on a sentence, so it would be read untranslated
            raise ExploreError(
                f"-c {name}: an NLLB / M2M100 model reads the language codes of both sides, which the explorer's "
                "pages do not put on a sentence; translate it with tmt translate --src-lang --tgt-lang or tmt serve"
            )
    source = Path(examples) if examples is not None else None
    return Explorer(translators, read_examples(source), source.name if source is not None else "", limits, threads)
