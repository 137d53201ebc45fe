"""Greedy and beam search on tiny real Transformers.

Expectations come from independent computations: the length penalty from its formula, log-probs
from a teacher-forced ``model.forward`` over BOS + tokens, and beam search from a by-the-book
reference that recomputes every prefix and never stops early (so it also checks the early-stop
bound). A module fixture trains a tiny model on a toy reversal task for a few seconds, so its
outputs are peaked enough for beam and greedy search to be compared meaningfully.
"""

from __future__ import annotations

import copy
import math
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_model, tiny_model_config
from transformer_mt.decoding import (
    SearchCache,
    SearchError,
    SearchModel,
    beam_search,
    greedy_search,
    greedy_search_batches,
    length_penalty,
    search,
    search_batches,
)
from transformer_mt.model import Transformer
from transformer_mt.text import BOS_ID, DEFAULT, EOS_ID, PAD_ID

VOCAB = 16  # 4 specials + 12 symbols


ONE_LAYER: dict[str, Any] = {"encoder_layers": 1, "decoder_layers": 1}  # conftest's tiny model with one layer a side
pytestmark = pytest.mark.usefixtures("one_thread")


def pad_batch(seqs: list[list[int]]) -> torch.Tensor:
    """Sources (each already ending in EOS) -> (B, S) padded with PAD_ID."""
    out = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(seq)
    return out


def reversal_batch(gen: torch.Generator, n: int, lo: int = 1, hi: int = 7):
    """The toy task: target = source symbols reversed. Returns src (B, S), tgt_in (B, T), tgt_out (B, T)."""
    src, tgt_in, tgt_out = [], [], []
    for length in torch.randint(lo, hi + 1, (n,), generator=gen).tolist():
        x = torch.randint(4, VOCAB, (length,), generator=gen).tolist()
        src.append(x + [EOS_ID])
        tgt_in.append([BOS_ID] + x[::-1])
        tgt_out.append(x[::-1] + [EOS_ID])
    return pad_batch(src), pad_batch(tgt_in), pad_batch(tgt_out)


@pytest.fixture(scope="module")
def trained() -> Transformer:
    """A 1+1-layer model trained 150 Adam steps on reversal: peaked, but not yet always right."""
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(**ONE_LAYER), src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(0)
    for _ in range(150):
        src, tgt_in, tgt_out = reversal_batch(gen, 32)
        loss = F.cross_entropy(model(src, tgt_in).view(-1, VOCAB), tgt_out.view(-1), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def untrained() -> Transformer:
    """Random weights: near-uniform outputs, so many sentences run to the length limit."""
    return tiny_model(VOCAB, seed=1, **ONE_LAYER)


@pytest.fixture(scope="module")
def peaked() -> Transformer:
    """Random weights with the output layer (untied) scaled up: confident, arbitrary choices."""
    torch.manual_seed(1)
    model = Transformer(
        tiny_model_config(**ONE_LAYER, share_all_embeddings=False, share_decoder_embeddings=False),
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
    )
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)
    return model.eval()


@pytest.fixture(scope="module")
def sources() -> torch.Tensor:
    """Eight test sentences of 1..9 symbols (+ EOS), padded: (8, S)."""
    gen = torch.Generator().manual_seed(123)
    seqs = [torch.randint(4, VOCAB, (n,), generator=gen).tolist() + [EOS_ID] for n in (5, 1, 9, 3, 7, 2, 8, 4)]
    return pad_batch(seqs)


def unpadded(src: torch.Tensor, i: int) -> torch.Tensor:
    return src[i][src[i] != PAD_ID]


def max_len(src: torch.Tensor, i: int, a: float, b: int) -> int:
    return math.floor(a * int((src[i] != PAD_ID).sum()) + b)


def teacher_forced_logprob(model: Transformer, src_row: torch.Tensor, tokens: list[int], *, eos: bool) -> float:
    """Sum of log p(y_t | y_<t, x) over tokens (+ EOS), from one full forward over BOS + tokens."""
    target = tokens + [EOS_ID] if eos else tokens
    tgt_in = torch.tensor([[BOS_ID] + target[:-1]])
    with torch.no_grad():
        lprobs = torch.log_softmax(model(src_row[None], tgt_in).float(), dim=-1)[0]  # (T, V)
    return lprobs[torch.arange(len(target)), torch.tensor(target)].sum().item()


def reference_beam(
    model: Transformer, src_row: torch.Tensor, *, beam: int, lenpen: float, max_len: int
) -> list[tuple[list[int], float, float]]:
    """Beam search by the book: every step recomputes every prefix with model.forward and it runs to
    max_len (no early stop). Same rules as the module: top 2*beam of beam*V candidates, EOS within the
    top beam finishes, the first beam non-EOS candidates stay open, open beams finish at max_len, ties
    to the lower flat index. Returns all finished (tokens, logprob, score), best score first."""
    opens: list[tuple[list[int], float]] = [([], 0.0)]
    finished = []
    for step in range(max_len):
        tgt_in = torch.tensor([[BOS_ID] + toks for toks, _ in opens])
        with torch.no_grad():
            lprobs = torch.log_softmax(model(src_row.expand(len(opens), -1), tgt_in)[:, -1].float(), dim=-1)
        cands = []
        for j, (toks, cum) in enumerate(opens):
            for v, lp in enumerate(lprobs[j].tolist()):
                if v not in (PAD_ID, BOS_ID):
                    cands.append((cum + lp, j * VOCAB + v, toks, v))
        cands.sort(key=lambda c: (-c[0], c[1]))
        cands = cands[: 2 * beam]
        for cum, _, toks, v in cands[:beam]:
            if v == EOS_ID:
                finished.append((toks, cum, cum / ((5 + step + 1) / 6) ** lenpen))
        opens = [(toks + [v], cum) for cum, _, toks, v in cands if v != EOS_ID][:beam]
        if step + 1 == max_len:
            finished += [(toks, cum, cum / ((5 + max_len) / 6) ** lenpen) for toks, cum in opens]
    return sorted(finished, key=lambda f: -f[2])


class Recording(Transformer):
    """The real model, counting encode / init_cache calls and the rows of every decode_step."""

    encodes: int
    inits: int
    rows: list[int]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.encodes, self.inits, self.rows = 0, 0, []

    def encode(self, src, **kwargs):
        self.encodes += 1
        return super().encode(src, **kwargs)

    def init_cache(self, enc):
        self.inits += 1
        return super().init_cache(enc)

    def decode_step(self, tokens, cache):
        self.rows.append(tokens.size(0))
        return super().decode_step(tokens, cache)


# The variants below reshape the logits of forward (which the teacher-forced checks and the reference
# search use) and of decode_step (which the searches use) the same way.


class NeverEos(Transformer):
    """The real model with EOS made impossible, so every hypothesis runs to the length limit."""

    def forward(self, src, tgt_in, **kwargs):
        logits = super().forward(src, tgt_in, **kwargs)  # (B, T, V)
        logits[..., EOS_ID] = float("-inf")
        return logits

    def decode_step(self, tokens, cache):
        logits = super().decode_step(tokens, cache)  # (B, V)
        logits[:, EOS_ID] = float("-inf")
        return logits


class LengthBait(Transformer):
    """The real model's logits damped, plus a bias by output position: the first output is EOS
    (p ~ 0.29) or else most likely token 5 (p ~ 0.17); after that token 4 is all but certain and EOS
    impossible. EOS at once wins with lenpen 0; with lenpen >= 0.6 the long hypothesis 5 4 4 ... wins,
    and only a search whose early stop bounds future scores with lp(max_len) finds it."""

    @staticmethod
    def _bait(logits, *, first: bool):  # (..., V) -> (..., V)
        bias = torch.zeros(logits.size(-1))
        if first:
            bias[EOS_ID], bias[5] = 2.0, 1.5
        else:
            bias[4], bias[EOS_ID] = 10.0, float("-inf")
        return 0.1 * logits.float() + bias

    def forward(self, src, tgt_in, **kwargs):
        logits = super().forward(src, tgt_in, **kwargs)  # (B, T, V)
        return torch.cat([self._bait(logits[:, :1], first=True), self._bait(logits[:, 1:], first=False)], dim=1)

    def decode_step(self, tokens, cache):
        first = cache.length == 0
        return self._bait(super().decode_step(tokens, cache), first=first)


class Rounded(Transformer):
    """The real model with logits rounded to integers: exact ties everywhere, often 3+ at the top."""

    def forward(self, src, tgt_in, **kwargs):
        return torch.round(super().forward(src, tgt_in, **kwargs))

    def decode_step(self, tokens, cache):
        return torch.round(super().decode_step(tokens, cache))


ModelT = TypeVar("ModelT", bound=Transformer)


def clone_as(cls: type[ModelT], model: Transformer, **cfg_changes) -> ModelT:
    other = cls(tiny_model_config(**ONE_LAYER, **cfg_changes), src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    other.load_state_dict(model.state_dict(), strict=False)
    return other.eval()


# --------------------------------------------------------------------------------------------------


def test_length_penalty_is_the_gnmt_formula():
    assert length_penalty(1, 1.0) == pytest.approx(1.0)  # (5 + 1) / 6
    assert length_penalty(7, 1.0) == pytest.approx(2.0)  # 12 / 6
    assert length_penalty(13, 0.5) == pytest.approx(math.sqrt(3.0))  # sqrt(18 / 6)
    assert length_penalty(25, 0.6) == pytest.approx(5.0**0.6)  # (30 / 6) ** 0.6
    assert length_penalty(40, 0.0) == 1.0
    assert torch.allclose(length_penalty(torch.tensor([1.0, 7.0, 19.0]), 2.0), torch.tensor([1.0, 4.0, 16.0]))


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_beam_size_one_is_greedy(which, request, sources):
    model = request.getfixturevalue(which)
    greedy = greedy_search(model, sources, max_len_a=1.0, max_len_b=4)
    beam1 = beam_search(model, sources, beam=1, lenpen=0.0, max_len_a=1.0, max_len_b=4)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam1]
    assert [h.logprob for h in greedy] == pytest.approx([hyps[0].logprob for hyps in beam1], abs=1e-6)
    if which == "untrained":  # make sure the length limit was exercised, not only EOS
        assert any(len(h.tokens) == max_len(sources, i, 1.0, 4) for i, h in enumerate(greedy))
    # With lenpen > 0 a 1-wide beam follows the greedy path to greedy's EOS and may only improve on it
    # afterwards (the bound keeps the runner-up open); search() maps beam 1 to greedy exactly.
    greedy_lp = greedy_search(model, sources, max_len_a=1.0, max_len_b=4, lenpen=0.6)
    beam1_lp = beam_search(model, sources, beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    assert all(b[0].score >= g.score - 1e-6 for g, b in zip(greedy_lp, beam1_lp))
    assert search(model, sources, beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=1) == [[h] for h in greedy_lp]


def _counting_steps(monkeypatch) -> list[int]:
    """Record the rows of every decode_step of every Transformer from now on."""
    rows: list[int] = []
    plain = Transformer.decode_step

    def counted(self, tokens, cache):
        rows.append(tokens.size(0))
        return plain(self, tokens, cache)

    monkeypatch.setattr(Transformer, "decode_step", counted)
    return rows


def _assert_same_hypotheses(got: list[list], expected: list[list]) -> None:
    """The same tokens; log-probs and scores equal up to float rounding (a vectorised pow may differ in the last
    bit)."""
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in expected]
    for hyps_got, hyps_expected in zip(got, expected):
        assert [h.logprob for h in hyps_got] == pytest.approx([h.logprob for h in hyps_expected], abs=1e-5)
        assert [h.score for h in hyps_got] == pytest.approx([h.score for h in hyps_expected], abs=1e-5)


# (model, batch_tokens, whether batches join): with a budget of 80 the trained model's last rows end before the next
# batch reaches their step, the untrained model's (which run to their limit) join it
def _steps_of(model, src: torch.Tensor, hyps: list, *, max_len_a: float, max_len_b: int) -> list[int]:
    """The decode steps each sentence of ``src`` took in its own search: its tokens plus the EOS step, or its
    limit when it stopped there (floor(a * source length) + b, at most the model's own limit)."""
    lengths = (src != PAD_ID).sum(dim=1).tolist()
    cap = model.max_output_length()
    limits = [min(math.floor(max_len_a * n) + max_len_b, cap if cap is not None else math.inf) for n in lengths]
    return [min(len(h.tokens) + 1, limit) for h, limit in zip(hyps, limits)]


def _rows_per_step(steps: list[list[int]], widths: list[int], batch_tokens: int) -> tuple[list[int], bool]:
    """The rows of every decode step that greedy_search_batches' documented schedule makes, and whether two
    batches joined: a batch whose running rows fill at most a quarter of the budget (rows x source width) is
    set aside while the next one starts; at the same step the two go on as one if they fit in the budget.
    A sentence needs the same steps as in its own batch, so its batches' searches alone fix the schedule."""
    rows: list[int] = []
    joined = False
    current = parked = None  # (steps still needed per running row, step, width)
    upcoming = list(range(len(steps)))
    while True:
        if current is None:
            if upcoming:
                i = upcoming.pop(0)
                current = (steps[i], 0, widths[i])
            elif parked is not None:
                current, parked = parked, None
            else:
                return rows, joined
        if parked is not None and parked[1] == current[1]:
            if (len(current[0]) + len(parked[0])) * max(current[2], parked[2]) <= batch_tokens:
                current, parked, joined = (current[0] + parked[0], current[1], max(current[2], parked[2])), None, True
        alive, step, width = current
        rows.append(len(alive))
        alive = [s for s in alive if s > step + 1]
        current = (alive, step + 1, width) if alive else None
        if current is not None and parked is None and upcoming and 4 * len(alive) * width <= batch_tokens:
            parked, current = current, None


@pytest.mark.parametrize(
    ("which", "batch_tokens"), [("trained", 10**6), ("untrained", 10**6), ("untrained", 80), ("trained", 80)]
)
def test_greedy_over_batches_carries_last_rows_along_and_finds_what_each_batch_finds_alone(
    which, batch_tokens, request, monkeypatch
):
    model = request.getfixturevalue(which)
    gen = torch.Generator().manual_seed(3)
    # Batches of similar lengths, longest first as translate_ids makes them; a join pads the narrower source side.
    srcs = [reversal_batch(gen, n, lo, hi)[0] for n, lo, hi in ((6, 6, 7), (9, 5, 7), (12, 5, 6), (5, 4, 6))]
    rows = _counting_steps(monkeypatch)
    alone = [greedy_search(model, src, max_len_a=1.0, max_len_b=6, lenpen=0.6) for src in srcs]
    steps_alone = len(rows)
    rows.clear()
    together = greedy_search_batches(model, srcs, max_len_a=1.0, max_len_b=6, lenpen=0.6, batch_tokens=batch_tokens)
    _assert_same_hypotheses(together, alone)
    # Where each sentence ends depends on the model and on this machine's rounding; the schedule that follows
    # from those ends does not: rebuild it from the searches alone and compare step by step.
    steps = [_steps_of(model, src, hyps, max_len_a=1.0, max_len_b=6) for src, hyps in zip(srcs, alone)]
    expected, joined = _rows_per_step(steps, [src.size(1) for src in srcs], batch_tokens)
    assert rows == expected
    assert (len(rows) < steps_alone) == joined  # rows of two batches went through one step
    if batch_tokens == 10**6:  # a batch parks after its first step, which the next batch always reaches: they join
        assert joined
    # Without a budget every batch is searched alone, step for step.
    rows.clear()
    _assert_same_hypotheses(greedy_search_batches(model, srcs, max_len_a=1.0, max_len_b=6, lenpen=0.6), alone)
    assert len(rows) == steps_alone


def test_search_batches_is_greedy_for_one_best_of_beam_1_and_beam_search_otherwise(trained, monkeypatch):
    """Several batches through ``search_batches`` (what ``translate_ids`` calls): beam 1 with one hypothesis is greedy
    search over all of them, its last rows going on with the next batch; any other setting is beam search, batch by
    batch, which is what refuses a beam of 1 with two hypotheses."""
    gen = torch.Generator().manual_seed(3)
    srcs = [reversal_batch(gen, n, lo, hi)[0] for n, lo, hi in ((6, 6, 7), (9, 5, 7), (5, 4, 6))]
    settings: dict[str, Any] = {"lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 6}
    rows = _counting_steps(monkeypatch)
    greedy = greedy_search_batches(trained, srcs, batch_tokens=10**6, **settings)
    greedy_rows = list(rows)
    rows.clear()
    found = search_batches(trained, srcs, beam=1, batch_tokens=10**6, **settings)
    assert rows == greedy_rows  # the same steps: rows carried along with the next batch
    assert [[nbest[0] for nbest in batch] for batch in found] == greedy
    assert all(len(nbest) == 1 for batch in found for nbest in batch)
    beam = search_batches(trained, srcs, beam=3, nbest=2, batch_tokens=10**6, **settings)
    assert beam == [beam_search(trained, src, beam=3, nbest=2, **settings) for src in srcs]
    with pytest.raises(SearchError, match="nbest=2 is out of range; use 1 to the beam size \\(1\\)"):
        search_batches(trained, srcs, beam=1, nbest=2, **settings)


def test_exact_ties_go_to_the_lowest_id_in_greedy_and_beam(untrained, sources):
    model = clone_as(Rounded, untrained)
    greedy = greedy_search(model, sources, max_len_a=1.0, max_len_b=4)
    beam1 = beam_search(model, sources, beam=1, lenpen=0.0, max_len_a=1.0, max_len_b=4)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam1]
    many_ties = 0
    for i, h in enumerate(greedy):
        eos = len(h.tokens) < max_len(sources, i, 1.0, 4)
        chosen = h.tokens + [EOS_ID] if eos else h.tokens
        with torch.no_grad():
            logits = model(unpadded(sources, i)[None], torch.tensor([[BOS_ID] + chosen[:-1]]))[0]  # (T, V)
        logits[:, [PAD_ID, BOS_ID]] = float("-inf")
        top = logits == logits.max(dim=-1, keepdim=True).values  # (T, V) the tied maxima
        assert chosen == top.int().argmax(dim=-1).tolist()  # the first (lowest) tied id at every step
        many_ties += int((top.sum(dim=-1) >= 3).sum())
    assert many_ties > 0, "the rounded model should produce three-way ties at the top"
    for beam in (1, 3):
        batched = beam_search(model, sources, beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=beam)
        for i in range(sources.size(0)):
            alone = beam_search(
                model, unpadded(sources, i)[None], beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=beam
            )
            assert [h.tokens for h in batched[i]] == [h.tokens for h in alone[0]]


def test_beam_beats_greedy_and_reports_teacher_forced_logprobs(trained, sources):
    a, b = 1.0, 4
    greedy = greedy_search(trained, sources, max_len_a=a, max_len_b=b)
    beams = beam_search(trained, sources, beam=4, lenpen=0.0, max_len_a=a, max_len_b=b)
    improved = 0
    for i, (g, hyps) in enumerate(zip(greedy, beams)):
        row, limit = unpadded(sources, i), max_len(sources, i, a, b)
        g_lp = teacher_forced_logprob(trained, row, g.tokens, eos=len(g.tokens) < limit)
        best = hyps[0]
        best_lp = teacher_forced_logprob(trained, row, best.tokens, eos=len(best.tokens) < limit)
        assert g.logprob == pytest.approx(g_lp, abs=1e-4)
        assert best.logprob == pytest.approx(best_lp, abs=1e-4)
        assert best.score == pytest.approx(best.logprob, abs=1e-6)  # lenpen 0: score = log-prob
        assert best_lp >= g_lp - 1e-4
        improved += best_lp > g_lp + 1e-3
    assert improved >= 1, "the toy model should leave beam search something to improve on"


def test_nbest_sorted_distinct_and_scored_by_the_formula(trained, sources):
    a, b, alpha = 1.0, 4, 0.6
    nbests = beam_search(trained, sources, beam=5, lenpen=alpha, max_len_a=a, max_len_b=b, nbest=5)
    assert len(nbests) == sources.size(0)
    for i, hyps in enumerate(nbests):
        assert len(hyps) == 5
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        row, limit = unpadded(sources, i), max_len(sources, i, a, b)
        for h in hyps:
            assert all(t not in (PAD_ID, BOS_ID, EOS_ID) for t in h.tokens)
            has_eos = len(h.tokens) < limit
            assert len(h.tokens) <= limit
            # A finished hypothesis that kept growing would no longer match its own log-prob.
            assert h.logprob == pytest.approx(teacher_forced_logprob(trained, row, h.tokens, eos=has_eos), abs=1e-4)
            length = len(h.tokens) + has_eos
            assert h.score == pytest.approx(h.logprob / ((5 + length) / 6) ** alpha, rel=1e-5)


@pytest.mark.parametrize("which", ["trained", "peaked"])
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.5])
def test_early_stopping_returns_what_running_to_max_length_returns(which, lenpen, request, sources):
    model = request.getfixturevalue(which)
    a, b, k = 1.0, 4, 3
    nbests = beam_search(model, sources, beam=k, lenpen=lenpen, max_len_a=a, max_len_b=b, nbest=k)
    for i, hyps in enumerate(nbests):
        ref = reference_beam(model, unpadded(sources, i), beam=k, lenpen=lenpen, max_len=max_len(sources, i, a, b))[:k]
        assert [h.tokens for h in hyps] == [toks for toks, _, _ in ref]
        assert [h.score for h in hyps] == pytest.approx([score for _, _, score in ref], abs=1e-4)


def test_early_stopping_happens(trained, sources):
    rec = clone_as(Recording, trained)
    beam_search(rec, sources, beam=3, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    assert len(rec.rows) < max(max_len(sources, i, 1.0, 4) for i in range(sources.size(0)))


@pytest.mark.parametrize("beam", [1, 2])
def test_early_stop_bound_keeps_long_hypotheses_the_length_penalty_favours(untrained, sources, beam):
    model = clone_as(LengthBait, untrained)
    for lenpen in (0.0, 0.6, 1.0, 2.0):
        nbests = beam_search(model, sources, beam=beam, lenpen=lenpen, max_len_a=1.0, max_len_b=4, nbest=beam)
        for i, hyps in enumerate(nbests):
            limit = max_len(sources, i, 1.0, 4)
            assert hyps[0].tokens == ([] if lenpen == 0.0 else [5] + [4] * (limit - 1))
            ref = reference_beam(model, unpadded(sources, i), beam=beam, lenpen=lenpen, max_len=limit)[:beam]
            assert [h.tokens for h in hyps] == [toks for toks, _, _ in ref]
            assert [h.score for h in hyps] == pytest.approx([score for _, _, score in ref], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_batched_equals_one_sentence_at_a_time(trained, sources, beam):
    def run(src):
        return search(trained, src, beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=min(beam, 2))

    batched = run(sources)
    for i in range(sources.size(0)):
        alone = run(unpadded(sources, i)[None])[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in alone], abs=1e-4)


def test_cache_used_once_per_step_and_finished_rows_dropped(trained, sources):
    rec = clone_as(Recording, trained)
    greedy = greedy_search(rec, sources, max_len_a=1.0, max_len_b=4)
    limits = [max_len(sources, i, 1.0, 4) for i in range(sources.size(0))]
    ends = [len(h.tokens) + (len(h.tokens) < lim) for h, lim in zip(greedy, limits)]  # steps each sentence ran
    assert (rec.encodes, rec.inits) == (1, 1)
    assert len(rec.rows) == max(ends)  # one decode_step per output position
    assert rec.rows == [sum(e > t for e in ends) for t in range(max(ends))]  # exactly the unfinished rows

    rec = clone_as(Recording, trained)
    beam_search(rec, sources, beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    assert (rec.encodes, rec.inits) == (1, 1)
    assert rec.rows[0] == 4 * sources.size(0) and all(r % 4 == 0 for r in rec.rows)
    assert rec.rows == sorted(rec.rows, reverse=True) and rec.rows[-1] < rec.rows[0]


@pytest.mark.parametrize("a, b", [(1.0, 3), (0.5, 2), (0.0, 1)])
def test_max_length_is_respected_without_eos(trained, sources, a, b):
    model = clone_as(NeverEos, trained)
    limits = [max_len(sources, i, a, b) for i in range(sources.size(0))]
    greedy = greedy_search(model, sources, max_len_a=a, max_len_b=b)
    assert [len(h.tokens) for h in greedy] == limits
    nbests = beam_search(model, sources, beam=3, lenpen=0.6, max_len_a=a, max_len_b=b, nbest=3)
    for i, hyps in enumerate(nbests):
        assert [len(h.tokens) for h in hyps] == [limits[i]] * 3
        for h in hyps:  # finished as is: no EOS term in the log-prob, length = the limit
            assert h.logprob == pytest.approx(
                teacher_forced_logprob(model, unpadded(sources, i), h.tokens, eos=False), abs=1e-4
            )
            assert h.score == pytest.approx(h.logprob / length_penalty(limits[i], 0.6), rel=1e-5)


def test_learned_positions_cap_the_length(trained, sources):
    model = clone_as(NeverEos, trained, positions="learned", max_positions=10)
    for hyps in search(model, sources, beam=2, lenpen=0.6, max_len_a=1.0, max_len_b=50, nbest=2):
        assert [len(h.tokens) for h in hyps] == [10, 10]
    assert [len(h.tokens) for h in greedy_search(model, sources, max_len_a=1.0, max_len_b=50)] == [10] * sources.size(0)


def test_bfloat16_autocast_and_bfloat16_weights(trained, sources):
    bf16_weights = copy.deepcopy(trained).to(torch.bfloat16)
    limits = [max_len(sources, i, 1.0, 4) for i in range(sources.size(0))]
    with torch.inference_mode():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs = [
                search(trained, sources, beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=1) for beam in (1, 4)
            ]
        runs += [
            search(bf16_weights, sources, beam=beam, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=1) for beam in (1, 4)
        ]
    for run in runs:
        for i, (h,) in enumerate(run):
            assert isinstance(h.logprob, float) and math.isfinite(h.logprob) and h.logprob <= 0
            assert len(h.tokens) <= limits[i] and all(
                0 <= t < VOCAB and t not in (PAD_ID, BOS_ID, EOS_ID) for t in h.tokens
            )
            length = len(h.tokens) + (len(h.tokens) < limits[i])
            assert h.score == pytest.approx(h.logprob / length_penalty(length, 0.6), rel=1e-5)


def test_bad_requests_are_refused(trained, sources):
    with pytest.raises(SearchError, match="nbest"):
        beam_search(trained, sources, beam=2, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=3)
    with pytest.raises(SearchError, match="nbest"):
        search(trained, sources, beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=4, nbest=2)
    with pytest.raises(SearchError, match="vocabulary"):
        beam_search(trained, sources, beam=8, lenpen=0.6, max_len_a=1.0, max_len_b=4)
    trained.train()
    try:
        with pytest.raises(SearchError, match="eval"):
            greedy_search(trained, sources)
    finally:
        trained.eval()


class CopyCache:
    """A toy cache: the source sentence of each row and the number of steps decoded."""

    def __init__(self, src: torch.Tensor):
        self.src, self.rows, self.length = src, torch.arange(src.size(0)), 0

    def reorder(self, indices: torch.Tensor, *, group: int | None = None, kept: torch.Tensor | None = None) -> None:
        self.rows = self.rows[indices]


class CopyModel:
    """Not a Transformer, not an nn.Module: only the SearchModel protocol. Step t puts all the probability
    on the source's t-th token (EOS last), so every search must return the source itself."""

    training = False
    specials = DEFAULT  # tmt's ids: rows start from BOS, end at EOS, pad with PAD

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return src

    def init_cache(self, enc: torch.Tensor) -> CopyCache:
        return CopyCache(enc)

    def decode_step(self, tokens: torch.Tensor, cache: CopyCache) -> torch.Tensor:
        src = cache.src[cache.rows]  # (R, S)
        column = torch.full((src.size(0),), PAD_ID) if cache.length >= src.size(1) else src[:, cache.length]
        logits = torch.zeros(src.size(0), VOCAB)
        logits[torch.arange(src.size(0)), column] = 5.0  # (R, V): p = e^5 / (e^5 + V - 1) on the copied token
        cache.length += 1
        return logits

    def max_output_length(self) -> int | None:
        return None


def test_search_needs_only_the_protocol(sources):
    """Transformer, Ensemble and a toy model that is neither all satisfy SearchModel; search runs the toy
    as it runs the real model, and its answers follow from the toy's rule (copy the source)."""
    from transformer_mt.model import Ensemble

    model = Transformer(tiny_model_config(**ONE_LAYER), src_vocab_size=VOCAB, tgt_vocab_size=VOCAB).eval()
    ensemble = Ensemble([model, model]).eval()
    models: list[SearchModel[Any, Any]] = [model, ensemble, CopyModel()]
    for m in models:
        assert isinstance(m, SearchModel)
        assert isinstance(m.init_cache(m.encode(sources)), SearchCache)
    assert not isinstance(object(), SearchModel)
    copies = [unpadded(sources, i)[:-1].tolist() for i in range(sources.size(0))]  # the source without its EOS
    assert [h.tokens for h in greedy_search(CopyModel(), sources)] == copies
    for hyps, want in zip(beam_search(CopyModel(), sources, beam=3, nbest=2), copies):
        assert hyps[0].tokens == want and hyps[1].tokens != want
        assert hyps[0].logprob == pytest.approx((len(want) + 1) * -math.log1p((VOCAB - 1) * math.exp(-5.0)), rel=1e-5)
