"""The beam search's observer hook: it changes nothing, and what it sees is what the search returns.

Decoding with an observer must give bit-identical hypotheses to decoding without one (the observer only
reads the step's tensors), and the observer's last view of each sentence's finished set must be the n-best
the search returns, rebuilt here from the steps' back-pointers.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model, tokens
from transformer_mt.decoding import BeamStep, beam_search, search
from transformer_mt.text import EOS_ID

pytestmark = pytest.mark.usefixtures("one_thread")


def sources(lengths: list[int]) -> torch.Tensor:
    src = tokens(lengths, seed=3)  # (B, S) random symbols, PAD-padded
    for row, n in enumerate(lengths):
        src[row, n - 1] = EOS_ID
    return src


@pytest.mark.parametrize("beam,lenpen", [(2, 0.6), (4, 1.0), (3, 0.0)])
def test_observer_changes_nothing_and_sees_the_final_nbest(beam, lenpen):
    model = tiny_model()
    src = sources([7, 3, 5])
    plain = beam_search(model, src, beam=beam, lenpen=lenpen, max_len_b=8, nbest=beam)
    steps: list[BeamStep] = []
    observed = beam_search(model, src, beam=beam, lenpen=lenpen, max_len_b=8, nbest=beam, observer=steps.append)
    assert observed == plain
    assert search(model, src, beam=beam, lenpen=lenpen, max_len_b=8, nbest=beam, observer=lambda _: None) == plain
    assert [st.step for st in steps] == list(range(len(steps)))
    last = {}  # sentence -> (its last step, its finished buffers there, its slot)
    for st in steps:
        assert st.rows.shape == st.tokens.shape == st.logprob.shape == (st.sent.numel(), beam)
        for slot, s in enumerate(st.sent.tolist()):
            last[s] = (st, slot)
    assert sorted(last) == [0, 1, 2]
    for s, (st, slot) in last.items():
        assert not bool(st.going_on[slot])  # each sentence's last step is the one that ended it
        score, logprob, _, _, _, valid = (f[slot] for f in st.finished)
        kept = [(round(a, 5), round(b, 5)) for a, b, v in zip(score.tolist(), logprob.tolist(), valid.tolist()) if v]
        assert kept == [(round(h.score, 5), round(h.logprob, 5)) for h in plain[s]]
