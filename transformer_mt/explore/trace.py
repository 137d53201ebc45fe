"""Beam search step by step: an observer of ``decoding.beam_search`` that writes down what each step decided.

At every step the search hands the observer a ``BeamStep`` (the tensors it already holds: the row each new open
beam extends, the token it appends, its log-prob, and the best ``k`` finished hypotheses so far). The observer
follows the back-pointers itself to spell each hypothesis out, so the search stays as it is: the trace is the
search's own arithmetic, read back, not a second search. One sentence at a time (the page's), so the rows of a
step are its beams 0..k-1.

Each step lists:

- ``open``: the ``k`` hypotheses that go on, best log-prob first, each with the beam it extends and the piece it
  appends;
- ``finished``: the best ``k`` finished so far (new ones marked), with log-prob, length (EOS counted), the GNMT
  penalty lp(length) = ((5 + length) / 6) ** alpha and the score log-prob / lp the search ranks them by;
- ``done`` and ``reason``: whether the search stopped after this step, and why.
"""

from __future__ import annotations

from collections.abc import Callable

from transformer_mt.decoding import BeamStep, Hypothesis, Translator, length_penalty
from transformer_mt.explore.analysis import output_limit, run_search


class BeamTrace:
    """Record one sentence's beam search; ``steps`` holds one plain dict per step (JSON-ready)."""

    def __init__(self, piece: Callable[[int], str], *, lenpen: float):
        self.piece, self.lenpen = piece, lenpen
        self.steps: list[dict] = []
        self._entering: list[list[list[int]]] = []  # per step: the token lists of the beams (rows) it extends
        self._open: list[list[int]] = []  # the open beams after the latest step

    def __call__(self, st: BeamStep) -> None:
        if st.sent.numel() != 1:
            raise ValueError("BeamTrace follows one sentence; search a batch of one")
        rows, toks, cums = st.rows[0].tolist(), st.tokens[0].tolist(), st.logprob[0].tolist()
        k = len(rows)
        entering = [[] for _ in range(k)] if st.step == 0 else [list(h) for h in self._open]
        self._entering.append(entering)
        self._open = [entering[r] + [t] for r, t in zip(rows, toks)]
        step = {
            "step": st.step,
            "length": st.step + 1,
            "open": [
                {"tokens": self._pieces(h), "logprob": c, "from_beam": r, "appended": self.piece(t)}
                for h, r, t, c in zip(self._open, rows, toks, cums)
            ],
            "finished": self._finished(st),
            "done": not bool(st.going_on[0]),
        }
        step["reason"] = self._reason(step, limit=int(st.limit[0]), best_open=cums[0])
        self.steps.append(step)

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self.piece(i) for i in ids]

    def _finished(self, st: BeamStep) -> list[dict]:
        """The kept finished hypotheses after this step, best first: tokens rebuilt from the step each
        finished at (the prefix of its row there, plus the appended token at the length limit)."""
        out = []
        for score, logprob, at, row, tok, valid in zip(*(f[0].tolist() for f in st.finished)):
            if not valid:
                continue
            ids = self._entering[at][row] + ([tok] if tok >= 0 else [])
            length = at + 1  # EOS included; at the length limit the appended token is the last
            out.append(
                {
                    "tokens": self._pieces(ids),
                    "ids": ids,
                    "eos": tok < 0,
                    "logprob": logprob,
                    "length": length,
                    "penalty": length_penalty(float(length), self.lenpen),
                    "score": score,
                    "new": at == st.step,
                }
            )
        return out

    def _reason(self, step: dict, *, limit: int, best_open: float) -> str:
        if not step["done"]:
            return "goes on: fewer than beam finished hypotheses, or an open one may still beat the worst of them"
        if step["length"] >= limit:
            return (
                f"stopped: reached the longest output this source may get ({limit} tokens); the open beams finished "
                "as they were"
            )
        most = max(length_penalty(float(step["length"] + 1), self.lenpen), length_penalty(float(limit), self.lenpen))
        worst = step["finished"][-1]["score"]
        return (
            f"stopped: {len(step['finished'])} finished, and the best open beam can score at most "
            f"{best_open:.4f} / {most:.4f} = {best_open / most:.4f} (its log-prob can only fall, divided by the "
            "largest penalty still possible), "
            f"not above the worst finished score {worst:.4f}"
        )


def explain_winner(nbest: list[Hypothesis], *, lenpen: float, limit: int, piece: Callable[[int], str]) -> dict:
    """The winner (the first of the search's n-best) and why it won, in words and numbers. ``limit``: the
    longest output the search allowed, where a hypothesis ends without EOS."""
    win = nbest[0]
    # EOS counted when it has one
    lengths = [len(h.tokens) + 1 if len(h.tokens) < limit else len(h.tokens) for h in nbest]
    pieces = [[piece(i) for i in h.tokens] for h in nbest]
    rows = [
        {"tokens": p, "logprob": h.logprob, "score": h.score, "length": n} for h, p, n in zip(nbest, pieces, lengths)
    ]
    lp = length_penalty(float(lengths[0]), lenpen)
    why = (
        f"highest score: log-prob / lp({lengths[0]}) = {win.logprob:.4f} / {lp:.4f} = {win.score:.4f} "
        f"among {len(rows)} finished"
    )
    better_raw = [j for j, h in enumerate(nbest) if j > 0 and h.logprob > win.logprob]
    if better_raw:
        j = better_raw[0]
        why += (
            f"; the length penalty (alpha {lenpen:g}) decided it: {' '.join(pieces[j]) or '(empty)'} "
            f"({lengths[j]} tokens) has the higher log-prob {nbest[j].logprob:.4f} but the lower score "
            f"{nbest[j].score:.4f}"
        )
    elif len(rows) > 1:
        why += f"; it also has the highest log-prob, so the length penalty (alpha {lenpen:g}) did not change the order"
    return {"tokens": pieces[0], "logprob": win.logprob, "score": win.score, "why": why, "nbest": rows}


def beam_view(tr: Translator, src_ids: list[int], *, beam: int, lenpen: float) -> dict:
    """The search `tmt translate` runs for one sentence, traced: its steps, the n-best, the winner and why."""
    piece = tr.tgt_tok.id_to_piece
    trace = BeamTrace(piece, lenpen=lenpen)
    nbest = run_search(tr, src_ids, beam=beam, lenpen=lenpen, observer=trace if beam > 1 else None)
    winner = explain_winner(nbest, lenpen=lenpen, limit=output_limit(tr, len(src_ids)), piece=piece)
    if beam == 1:
        winner["why"] = (
            "beam 1 is greedy search: the most probable piece at every step, one hypothesis; no beam to trace"
        )
    return {
        "translation": tr.tgt_tok.decode([nbest[0].tokens])[0],
        "beam": beam,
        "lenpen": lenpen,
        "steps": trace.steps,
        "winner": winner,
    }
