"""Sampling (transformer_mt.decoding.sampling): the draws follow the model's distribution and the truncations, and a
line's samples depend on the seed and its line number alone.

The statistics: N independent draws of the first token of one real Multi30k sentence from the tiny trained model,
compared with the distribution computed here from the model's own first-step logits (the truncations applied by a
loop over the ranked tokens, in float64). Two bounds, each failing a correct sampler with probability below 1e-6:

- total variation: E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / N) (Jensen, per token), and TV moves by at most 1/N when
  one draw changes, so P(TV > E[TV] + t) <= exp(-2 N t^2) (McDiarmid): t = sqrt(ln(1e6) / (2 N));
- Pearson's chi-square over the tokens expected at least 5 times (the others pooled into one bin), below the
  1 - 1e-6 quantile of chi-square with (bins - 1) degrees of freedom (Wilson-Hilferty's approximation, z = 4.753).

The draws are seeded, so each test is deterministic; the bounds say why its thresholds are not arbitrary, and each
test also checks that a wrong distribution (another temperature) lies outside them, so that it can fail.
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
import torch

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.config import ConfigError, load_config
from transformer_mt.data import source_tensor
from transformer_mt.decoding import (
    Sampling,
    SearchError,
    Translator,
    draw,
    greedy_search,
    sample_batches,
    translate_stream,
)
from transformer_mt.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")

DELTA = 1e-6  # the chance that a correct sampler fails one bound
Z = 4.753  # the standard normal's 1 - DELTA quantile


# ---------------------------------------------------------------- one step, by hand
def _draw(probs: list[float], u: float, **settings) -> int:
    lprobs = torch.tensor([probs], dtype=torch.float32).log()  # (1, C); a probability 0 is -inf
    return int(draw(lprobs, torch.tensor([u]), Sampling(**settings)))


def test_one_draw_is_the_inverse_cdf_of_the_kept_tokens() -> None:
    """Ranked: id 1 (0.5), id 2 (0.3), id 0 (0.1), id 3 (0.05), id 4 (0.05), equal ones by id; u picks the first
    rank whose cumulative probability (of the kept tokens, renormalised) passes u."""
    p = [0.1, 0.5, 0.3, 0.05, 0.05]
    assert [_draw(p, u) for u in (0.0, 0.49, 0.51, 0.79, 0.81, 0.91, 0.96, 0.9999)] == [1, 1, 2, 2, 0, 3, 4, 4]
    assert {_draw(p, u, top_k=1) for u in (0.0, 0.5, 0.9999)} == {1}
    assert [_draw(p, u, top_k=2) for u in (0.6, 0.7)] == [1, 2]  # kept {1: 0.625, 2: 0.375}
    # the nucleus of 0.7: 0.5 has not reached it, 0.5 + 0.3 has: ids 1 and 2, renormalised as above
    assert [_draw(p, u, top_p=0.7) for u in (0.6, 0.7, 0.9999)] == [1, 2, 2]
    assert [_draw(p, u, epsilon=0.08) for u in (0.5, 0.95, 0.9999)] == [1, 0, 0]  # ids 1, 2, 0 (mass 0.9)
    assert {_draw(p, u, epsilon=0.9) for u in (0.0, 0.9999)} == {1}  # the most probable always stays
    assert {_draw(p, u, temperature=1e-3) for u in (0.0, 0.9999)} == {1}  # near 0: the most probable
    # top_p is measured on what top_k left: after top_k 2, id 1 holds 0.625 >= 0.6, so it stays alone (on the whole
    # distribution the nucleus of 0.6 would be ids 1 and 2)
    assert _draw(p, 0.9999, top_k=2, top_p=0.6) == 1 and _draw(p, 0.9999, top_p=0.6) == 2
    assert _draw([0.6, 0.4, 0.0], 0.9999) == 1  # an impossible id is never drawn


def test_bad_settings_are_one_line_errors(spm_model, tmp_path, capsys) -> None:
    for settings, start in (
        ({"temperature": 0.0}, "temperature=0.0 must be a number above 0"),
        ({"temperature": math.nan}, "temperature=nan must be"),
        ({"top_k": -1}, "top_k=-1 must be 0"),
        ({"top_p": 0.0}, "top_p=0.0 is outside (0, 1]"),
        ({"top_p": 1.5}, "top_p=1.5 is outside (0, 1]"),
        ({"epsilon": 1.0}, "epsilon=1.0 is outside [0, 1)"),
        ({"seed": -1}, "seed=-1 is out of range"),
        ({"seed": 10**40}, "seed=10000000000000000... is out of range"),
    ):
        with pytest.raises(SearchError) as refused:
            Sampling(**settings)
        assert str(refused.value).startswith(start) and "\n" not in str(refused.value), refused.value
    with pytest.raises(ConfigError, match=r"decode\.top_p: 2\.0 is outside \(0, 1\]"):
        load_config(None, ["decode.top_p=2.0"])
    # with decode.sample, nbest counts samples: more than the beam is fine, and the beam (4 by default) is not used
    assert load_config(None, ["decode.sample=true", "decode.nbest=8"]).decode.nbest == 8
    with pytest.raises(ConfigError, match=r"decode\.nbest: 8 is out of range"):
        load_config(None, ["decode.nbest=8"])

    ckpt = make_checkpoint(spm_model, tmp_path / "m.pt")
    src = tmp_path / "in.en"
    src.write_text("A dog runs.\n", encoding="utf-8")
    for argv, message in (
        (["--sample", "--temperature", "0"], "tmt: error: --temperature 0.0 must be a number above 0"),
        (["--sample", "--top-p", "1.5"], "tmt: error: --top-p 1.5 is outside (0, 1]"),
        (["--sample", "--beam", "4"], "tmt: error: --beam 4 does not apply to sampling"),
        (["--top-k", "5"], "tmt: error: --top-k applies to sampling only; add --sample"),
        (["--sample", "--nbest", "0"], "tmt: error: --nbest 0 is out of range"),
        (["--sample", "--seed", "1" * 500], "tmt: error: --seed 11111111111111111... is out of range"),
    ):
        code, out, err = run_cli(["translate", "-c", ckpt, src, "--device", "cpu", *argv], capsys)
        assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1, (argv, err)


# ---------------------------------------------------------------- the first token's distribution
@pytest.fixture(scope="module")
def tiny(tiny_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint, device="cpu", threads=1)


@pytest.fixture(scope="module")
def first_step(tiny, multi30k) -> tuple[torch.Tensor, np.ndarray]:
    """A real source (1, S) and the model's first-step logits (V,) float64, the ids never generated at -inf."""
    model = tiny.model
    src = source_tensor(tiny.src_tok.encode(head(multi30k / "val.en", 1)), specials=model.specials)
    with torch.inference_mode():
        logits = model.decode_step(torch.tensor([model.specials.start]), model.init_cache(model.encode(src)))
    out = logits[0].double().numpy().copy()
    out[list(model.specials.never_generated)] = -np.inf
    return src, out


def _expected(logits: np.ndarray, *, temperature=1.0, top_k=0, top_p=1.0, epsilon=0.0) -> np.ndarray:
    """The distribution a sampler must draw from, by the definitions: softmax at the temperature, then top_k, top_p and
    epsilon, each on what the one before left (renormalised), then renormalised."""
    z = logits / temperature
    q = np.exp(z - z.max())
    q /= q.sum()
    kept = [int(i) for i in np.argsort(-q, kind="stable") if q[i] > 0]  # most probable first, equal ones by id
    if top_k:
        kept = kept[:top_k]
    if top_p < 1:
        mass, reached, nucleus = q[kept].sum(), 0.0, []
        for i in kept:
            nucleus.append(i)
            reached += q[i] / mass
            if reached >= top_p:
                break
        kept = nucleus
    if epsilon:
        mass = q[kept].sum()
        kept = kept[:1] + [i for i in kept[1:] if q[i] / mass >= epsilon]
    out = np.zeros_like(q)
    out[kept] = q[kept] / q[kept].sum()
    return out


def _first_tokens(model: Transformer, src: torch.Tensor, sampling: Sampling, n: int) -> np.ndarray:
    """n first tokens drawn for ``src`` (EOS when the sample ends at once), in ten batches of n / 10 samples, each
    batch its own line number (so all n draws are independent), as frequencies over the vocabulary."""
    found = sample_batches(
        model, [src] * 10, sampling=sampling, nbest=n // 10, lines=[[k] for k in range(10)], max_len_a=0, max_len_b=1
    )
    eos = model.specials.eos
    drawn = [h.tokens[0] if h.tokens else eos for batch in found for hyps in batch for h in hyps]
    assert len(drawn) == n and all(len(h.tokens) <= 1 for batch in found for hyps in batch for h in hyps)
    return np.bincount(drawn, minlength=model.output_size) / n


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def _tv_bound(p: np.ndarray, n: int) -> float:
    return 0.5 * float(np.sqrt(p * (1 - p) / n).sum()) + math.sqrt(math.log(1 / DELTA) / (2 * n))


def _chi_square(freq: np.ndarray, p: np.ndarray, n: int) -> tuple[float, float]:
    """Pearson's statistic over the bins expected >= 5 times and one pooled bin of the rest, and its 1 - DELTA
    quantile (Wilson-Hilferty)."""
    big = p * n >= 5
    observed = np.append(freq[big] * n, freq[~big].sum() * n)
    expected = np.append(p[big] * n, p[~big].sum() * n)
    if expected[-1] < 5:  # too little pooled mass for a bin of its own: merged into the last
        observed, expected = observed[:-1], expected[:-1]
        observed[-1] += freq[~big].sum() * n
        expected[-1] += p[~big].sum() * n
    df = len(expected) - 1
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return statistic, df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3


def test_first_token_frequencies_are_the_models_probabilities(tiny, first_step) -> None:
    """20,000 draws at temperature 1 against the model's own softmax: within the TV and chi-square bounds; the
    distribution at temperature 1.3 is outside them (the test can tell)."""
    src, logits = first_step
    n = 20_000
    freq, p = _first_tokens(tiny.model, src, Sampling(seed=11), n), _expected(logits)
    bound = _tv_bound(p, n)
    assert _tv(freq, p) <= bound
    statistic, quantile = _chi_square(freq, p, n)
    assert statistic <= quantile
    wrong = _expected(logits, temperature=1.3)
    assert _tv(wrong, p) > 2 * bound and _chi_square(freq, wrong, n)[0] > quantile


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.5},
        {"temperature": 2.0},
        {"top_k": 3},
        {"top_p": 0.8},
        {"epsilon": 0.005},
        {"temperature": 1.5, "top_k": 20, "top_p": 0.9, "epsilon": 0.01},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_truncations_draw_only_their_tokens_in_proportion(tiny, first_step, settings) -> None:
    """4,000 draws: every one among the tokens the settings keep (computed here from the definitions), at least two
    of them drawn, and the frequencies within the bounds of the renormalised distribution."""
    src, logits = first_step
    n = 4_000
    freq, p = _first_tokens(tiny.model, src, Sampling(seed=5, **settings), n), _expected(logits, **settings)
    kept = set(np.flatnonzero(p).tolist())
    drawn = set(np.flatnonzero(freq).tolist())
    assert drawn <= kept and len(drawn) >= 2
    if set(settings) == {"temperature"}:  # no cut: the distribution reshaped beyond what the bounds allow
        assert _tv(p, _expected(logits)) > 2 * _tv_bound(p, n)
    else:
        assert len(kept) < np.isfinite(logits).sum()
    assert _tv(freq, p) <= _tv_bound(p, n)
    statistic, quantile = _chi_square(freq, p, n)
    assert statistic <= quantile


# ---------------------------------------------------------------- reproducible whatever the batches
def _texts(result) -> list[list[str]]:
    return [[text for _, text in nb] for nb in result.hypotheses]


def test_a_lines_samples_depend_on_the_seed_and_its_number_alone(tiny, multi30k) -> None:
    """The same seed gives every line the same samples in one call or alone (its number given), in batches of any
    size, with two threads or one, and through a stream in chunks; another seed gives other samples."""
    lines = head(multi30k / "val.en", 12)
    lines[7] = ""  # an empty line is not decoded, and keeps its number
    sampling = Sampling(seed=5)

    def texts(lines: list[str], **options) -> list[list[str]]:
        result = tiny.translate_batch(lines, beam=1, lenpen=0.6, max_len_b=6, **{"sampling": sampling, **options})
        return [[text for _, text in nb] for nb in result.hypotheses]

    whole = texts(lines, nbest=3)
    assert all(len(nb) == 3 for nb in whole) and whole[7] == [""] * 3
    assert texts(lines, nbest=3, batch_tokens=40) == whole
    alone = [
        texts([line], nbest=3, sampling=dataclasses.replace(sampling, first_line=i)) for i, line in enumerate(lines)
    ]
    assert [nb for [nb] in alone] == whole
    torch.set_num_threads(2)
    try:
        assert texts(lines, nbest=3) == whole
    finally:
        torch.set_num_threads(1)
    # sample j of a line does not depend on how many are drawn: the one sample is among the three
    one = texts(lines)
    assert all(nb[0] in three for nb, three in zip(one, whole))
    other = texts(lines, nbest=3, sampling=Sampling(seed=6))
    assert sum(a != b for a, b in zip(other, whole)) >= 9  # 11 lines with text: nearly all differ
    assert sum(len(set(nb)) > 1 for nb in whole) >= 9  # a line's samples are independent draws
    # a stream numbers its lines over the chunks (the checkpoint's own output lengths)
    out = io.StringIO()
    translate_stream(tiny, [lines[:5], lines[5:9], lines[9:]], out, beam=1, lenpen=0.6, sampling=sampling)
    streamed = tiny.translate_batch(lines, beam=1, lenpen=0.6, sampling=sampling).hypotheses
    assert out.getvalue().split("\n")[:-1] == [nb[0][1] for nb in streamed]


def test_top_k_1_is_greedy_search(tiny, multi30k) -> None:
    """Drawing among the one most probable token is greedy search: the same tokens, log-probs and scores (the loop,
    its limits and the cache's rows match greedy's)."""
    ids = tiny.src_tok.encode(head(multi30k / "val.en", 16))
    src = source_tensor(ids, specials=tiny.model.specials)
    sampled = sample_batches(tiny.model, [src], sampling=Sampling(top_k=1, seed=3), lenpen=0.6, max_len_b=10)[0]
    greedy = greedy_search(tiny.model, src, lenpen=0.6, max_len_b=10)
    assert [nb[0].tokens for nb in sampled] == [h.tokens for h in greedy]
    assert [nb[0].score for nb in sampled] == pytest.approx([h.score for h in greedy], abs=1e-5)


def test_the_python_api_and_the_command_line(tiny, tiny_checkpoint, multi30k, tmp_path, capsys) -> None:
    """translate(sample=True, ...) and tmt translate --sample give the library's samples; their refusals."""
    lines = head(multi30k / "val.en", 6)
    expected = _texts(tiny.translate_batch(lines, beam=1, lenpen=0.6, sampling=Sampling(seed=3, top_p=0.9)))
    assert tiny.translate(lines, sample=True, seed=3, top_p=0.9) == [nb[0] for nb in expected]
    # a checkpoint whose decode section says sample: its settings are the defaults, sample=False searches
    decode = dataclasses.replace(tiny.cfg.decode, sample=True, seed=3, top_p=0.9)
    sampler = Translator(
        tiny.model, tiny.src_tok, tiny.tgt_tok, dataclasses.replace(tiny.cfg, decode=decode), device=tiny.device
    )
    assert sampler.translate(lines) == [nb[0] for nb in expected]
    assert sampler.translate(lines, sample=False) == tiny.translate(lines) != sampler.translate(lines)
    with pytest.raises(SearchError, match="beam=2 does not apply to sampling"):
        tiny.translate(lines, sample=True, beam=2)
    with pytest.raises(SearchError, match="temperature applies to sampling only; add sample=True"):
        tiny.translate(lines, temperature=0.7)
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["translate", "-c", tiny_checkpoint, src, "--device", "cpu", "--sample", "--seed", "3", "--top-p", "0.9"]
    code, out, err = run_cli(argv, capsys)
    assert (code, err) == (0, "") and out.split("\n")[:-1] == [nb[0] for nb in expected]
    code, out, _ = run_cli([*argv, "--nbest", "2", "--batch-tokens", "30"], capsys)
    two = _texts(tiny.translate_batch(lines, beam=1, lenpen=0.6, nbest=2, sampling=Sampling(seed=3, top_p=0.9)))
    assert code == 0 and [line.split("\t")[2] for line in out.split("\n")[:-1]] == [t for nb in two for t in nb]
