"""`PairFilter`: the enabled rules of ``data.filters`` over a stream of pairs, each pair counted once.

The rules run in the order of :data:`ORDER` (cheap and common first, language identification last), and a pair is
dropped under the first rule that drops it. ``empty`` is always on: a pair with an empty side is never a training
pair. The duplicate rule remembers the pairs that passed ``empty`` across every call of :meth:`PairFilter.check`, so
a corpus streams through in chunks of any size with the same result as in one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformer_mt.cleaning import language_id, rules, scripts
from transformer_mt.cleaning.duplicates import Duplicates
from transformer_mt.cleaning.errors import CleaningError
from transformer_mt.config import FiltersConfig

KEEP = "keep"  # the verdict of a pair no rule drops
# Every rule by the name of what it drops, in the order they are tried.
ORDER = (
    "empty",  # a side is empty or whitespace
    "exact_duplicate",  # duplicates: exact, the same pair seen before
    "normalized_duplicate",  # duplicates: normalized, the same pair after normalisation seen before
    "identical",  # the target is the source
    "too_few_words",  # min_words: a side has fewer words
    "too_many_words",  # max_words: a side has more words
    "length_ratio",  # max_ratio: the longer side has more than max_ratio times the words of the shorter
    "nonletter",  # max_nonletter: a side has a larger share of non-letters
    "wrong_script",  # script: a side's letters are mostly outside its language's scripts
    "wrong_language",  # langid: a side is identified as another language
    "uncertain_language",  # langid_min_prob: a side is identified right, with a lower probability
)

Pairs = list[tuple[str, str]]
Step = Callable[[Pairs], list[str | None]]  # a rule over pairs: the name it drops each under, None to keep


@dataclass
class CleaningReport:
    """What a filter did: pairs read and kept, pairs dropped by each enabled rule, and notes on rules skipped."""

    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # every enabled rule, in ORDER, zero included
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"read": self.read, "kept": self.kept, "dropped": dict(self.dropped), "notes": list(self.notes)}

    def lines(self) -> list[str]:
        """The report as text: a summary line, then one line per rule and one per note."""
        share = f" ({100 * self.kept / self.read:.1f}%)" if self.read else ""
        width = max((len(rule) for rule in self.dropped), default=0)
        return (
            [f"read {self.read:,} pairs, kept {self.kept:,}{share}, dropped {self.read - self.kept:,}"]
            + [f"  {rule:<{width}}  {n:,}" for rule, n in self.dropped.items()]
            + [f"  note: {note}" for note in self.notes]
        )


class PairFilter:
    """The rules ``filters`` enables for pairs of ``src_lang`` -> ``tgt_lang``, applied chunk by chunk.

    ``check(sources, targets)`` returns, for each pair in order, :data:`KEEP` or the name of the rule that drops
    it; ``report()`` the counts so far. Languages are ISO 639 codes (``de``, ``deu``, ``deu_Latn``); the script
    and langid rules need them, and skip a side whose language they do not know, with a note in the report.
    Raises :class:`CleaningError` when langid is asked without py3langid, or script / langid without languages.
    """

    def __init__(self, filters: FiltersConfig, src_lang: str = "", tgt_lang: str = "", *, corpus: str = ""):
        self.filters = filters
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self._where = f"corpus {corpus}: " if corpus else ""
        self._notes: list[str] = []
        steps: dict[str, Step] = {"empty": _pairwise("empty", rules.empty)}
        if filters.duplicates != "off":
            name = f"{filters.duplicates}_duplicate"
            steps[name] = _duplicates(name, Duplicates(normalized=filters.duplicates == "normalized"))
        if filters.identical:
            steps["identical"] = _pairwise("identical", rules.identical)
        steps.update(_word_steps(filters))
        if filters.max_nonletter > 0:
            steps["nonletter"] = _pairwise("nonletter", lambda s, t: rules.nonletter(s, t, filters.max_nonletter))
        if filters.script:
            steps["wrong_script"] = self._script_step()
        if filters.langid:
            steps["wrong_language"] = self._langid_step()  # also drops uncertain_language with langid_min_prob
        self._steps = [steps[name] for name in ORDER if name in steps]
        uncertain = {"uncertain_language"} if filters.langid and filters.langid_min_prob > 0 else set()
        self.rules = tuple(name for name in ORDER if name in steps or name in uncertain)  # the enabled rules, in order
        self._counts = dict.fromkeys(self.rules, 0)
        self._read = 0

    @property
    def enabled(self) -> bool:
        """Whether any rule besides ``empty`` is on (without one, the filter only drops empty pairs)."""
        return len(self.rules) > 1

    def check(self, sources: Sequence[str], targets: Sequence[str]) -> list[str]:
        """The verdict of each pair, in order: :data:`KEEP` or the name of the first rule that drops it."""
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        verdicts = [KEEP] * len(sources)
        alive = list(range(len(sources)))
        pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets)]
        for step in self._steps:
            if not alive:
                break
            dropped = step([pairs[i] for i in alive])
            for i, name in zip(alive, dropped):
                if name is not None:
                    verdicts[i] = name
                    self._counts[name] += 1
            alive = [i for i, name in zip(alive, dropped) if name is None]
        self._read += len(sources)
        return verdicts

    def report(self) -> CleaningReport:
        """The counts so far."""
        kept = self._read - sum(self._counts.values())
        return CleaningReport(self._read, kept, dict(self._counts), list(self._notes))

    def _languages(self, rule: str) -> tuple[str, str]:
        if not (self.src_lang and self.tgt_lang):
            raise CleaningError(
                f"{self._where}data.filters.{rule} needs the languages of the pairs; "
                "name them (src_lang and tgt_lang of the corpus, or tmt clean --src-lang and --tgt-lang)"
            )
        return self.src_lang, self.tgt_lang

    def _script_step(self) -> Step:
        expected = []
        for side, lang in zip(("source", "target"), self._languages("script")):
            known = scripts.scripts_of(lang)
            if known is None:
                note = f"wrong_script skips the {side} side: no script is listed for {lang!r}"
                self._notes.append(self._where + note)
            expected.append(known)
        src_scripts, tgt_scripts = expected

        def wrong_script(pairs: Pairs) -> list[str | None]:
            return [
                "wrong_script" if scripts.wrong_script(s, src_scripts) or scripts.wrong_script(t, tgt_scripts) else None
                for s, t in pairs
            ]

        return wrong_script

    def _langid_step(self) -> Step:
        expected = []
        for side, lang in zip(("source", "target"), self._languages("langid")):
            label = language_id.langid_code(lang)  # loads py3langid, or names the extra to install
            if label is None:
                note = f"wrong_language skips the {side} side: py3langid does not know {lang!r}"
                self._notes.append(self._where + note)
            expected.append(label)
        src_label, tgt_label = expected
        min_prob = self.filters.langid_min_prob

        def wrong_language(pairs: Pairs) -> list[str | None]:
            found_src = language_id.identify([s for s, _ in pairs]) if src_label else [("", 1.0)] * len(pairs)
            found_tgt = language_id.identify([t for _, t in pairs]) if tgt_label else [("", 1.0)] * len(pairs)
            verdicts: list[str | None] = []
            for fs, ft in zip(found_src, found_tgt):
                if language_id.wrong_language(fs, src_label) or language_id.wrong_language(ft, tgt_label):
                    verdicts.append("wrong_language")
                elif language_id.uncertain_language(fs, src_label, min_prob) or language_id.uncertain_language(
                    ft, tgt_label, min_prob
                ):
                    verdicts.append("uncertain_language")
                else:
                    verdicts.append(None)
            return verdicts

        return wrong_language


def _pairwise(name: str, drops: Callable[[str, str], bool]) -> Step:
    """A step from a rule that looks at one pair alone."""
    return lambda pairs: [name if drops(s, t) else None for s, t in pairs]


def _duplicates(name: str, duplicates: Duplicates) -> Step:
    def step(pairs: Pairs) -> list[str | None]:
        repeated = duplicates.repeated([s for s, _ in pairs], [t for _, t in pairs])
        return [name if r else None for r in repeated.tolist()]

    return step


def _word_steps(filters: FiltersConfig) -> dict[str, Step]:
    """The rules on word counts (too_few_words, too_many_words, length_ratio) that ``filters`` enables."""
    checks = {
        "too_few_words": (filters.min_words, rules.too_few_words),
        "too_many_words": (filters.max_words, rules.too_many_words),
        "length_ratio": (filters.max_ratio, rules.length_ratio),
    }
    steps: dict[str, Step] = {}
    for name, (limit, drops) in checks.items():
        if limit:
            steps[name] = _counted(name, drops, limit)
    return steps


def _counted(name: str, drops: Callable[[int, int, float], bool], limit: float) -> Step:
    counts = rules.word_count
    return lambda pairs: [name if drops(counts(s), counts(t), limit) else None for s, t in pairs]
