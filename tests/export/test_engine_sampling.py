"""`--engine ctranslate2 --sample`: tmt's sampling settings reach CTranslate2's sampler, its samples keep tmt's rules
(empty lines, n-best lists, per-sentence output limits), a seed reproduces a run, and epsilon, which CTranslate2 has
not, is refused in one line."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.decoding import Sampling
from transformer_mt.export import ExportError, ctranslate2_translator

ctranslate2 = pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def random_ckpt(spm_model, tmp_path_factory):
    """A random model (tests.conftest.make_checkpoint): its outputs of at most source + 6 pieces."""
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("engine_sampling") / "m.pt")


@pytest.fixture(scope="module")
def lines(multi30k) -> list[str]:
    test = head(multi30k / "test_2016_flickr.en", 12)
    return test[:5] + [""] + test[5:]


class _Recorder:
    """CTranslate2's translator, each translate_batch call's options recorded."""

    def __init__(self, ct: Any):
        self.ct = ct
        self.calls: list[dict[str, Any]] = []

    def translate_batch(self, source, **options):
        self.calls.append(options)
        return self.ct.translate_batch(source, **options)

    def score_batch(self, *args, **options):
        return self.ct.score_batch(*args, **options)


def _texts(result) -> list[list[str]]:
    return [[text for _, text in nb] for nb in result.hypotheses]


def test_the_settings_reach_ctranslate2s_sampler(random_ckpt, lines, monkeypatch) -> None:
    engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
    recorder = engine.ct = _Recorder(engine.ct)
    outputs: list[list[str]] = []  # the pieces of every hypothesis, in order, as the engine decodes them to text
    decode_pieces = engine.tgt_tok.decode_pieces

    def recorded(pieces: list[list[str]], **options: Any) -> list[str]:
        outputs.extend(pieces)
        return decode_pieces(pieces, **options)

    monkeypatch.setattr(engine.tgt_tok, "decode_pieces", recorded)
    sampling = Sampling(temperature=0.7, top_k=20, top_p=0.9, seed=4)
    result = engine.translate_batch(lines, beam=1, lenpen=0.6, nbest=3, sampling=sampling)
    [options] = recorder.calls
    assert {key: options[key] for key in ("beam_size", "num_hypotheses", "sampling_topk", "sampling_topp")} == {
        "beam_size": 1,
        "num_hypotheses": 3,
        "sampling_topk": 20,
        "sampling_topp": 0.9,
    }
    assert options["sampling_temperature"] == pytest.approx(0.7)
    assert len(result.hypotheses) == len(lines) and result.hypotheses[5] == [(0.0, "")] * 3
    sources = engine.src_tok.encode_pieces([line for line in lines if line], num_threads=1)
    assert len(outputs) == 3 * len(sources)
    for i, source in enumerate(sources):  # every sample within its sentence's limit: pieces + EOS + max_len_b (6)
        assert all(len(sample) <= len(source) + 1 + 6 for sample in outputs[3 * i : 3 * i + 3])
    assert max(map(len, outputs)) > 10  # the random model's samples run to their limits: the limits were met
    for nb in result.hypotheses:
        scores = [score for score, _ in nb]
        assert len(nb) == 3 and scores == sorted(scores, reverse=True)  # best first
    # drawing among the one most probable token is CTranslate2's greedy search
    top1 = engine.translate_batch(lines, beam=1, lenpen=0.6, sampling=Sampling(top_k=1))
    assert _texts(top1) == _texts(engine.translate_batch(lines, beam=1, lenpen=0.6))


def test_a_seed_reproduces_a_run(random_ckpt, lines) -> None:
    """A run (one engine, as `tmt translate` builds) with the same seed draws the same samples; another seed others."""

    def run(seed: int) -> list[list[str]]:
        engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
        return _texts(engine.translate_batch(lines, beam=1, lenpen=0.6, nbest=2, sampling=Sampling(seed=seed)))

    first = run(3)
    assert run(3) == first
    assert sum(a != b for a, b in zip(run(4), first)) >= 8  # 11 lines with text, each with 2 samples


def test_epsilon_is_refused_in_one_line(random_ckpt, lines, tmp_path, capsys) -> None:
    engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
    with pytest.raises(ExportError, match=r"^--epsilon 0\.01: CTranslate2 has no epsilon sampling; use --engine tmt"):
        engine.translate_batch(lines, beam=1, lenpen=0.6, sampling=Sampling(epsilon=0.01))
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["translate", "-c", random_ckpt, src, "--engine", "ctranslate2", "--device", "cpu", "--sample"]
    code, out, err = run_cli([*argv, "--epsilon", "0.01"], capsys)
    assert (code, out) == (2, "") and err.startswith("tmt: error: --epsilon 0.01: CTranslate2") and err.count("\n") == 1
    code, out, err = run_cli([*argv, "--nbest", "2", "--seed", "5"], capsys)
    assert code == 0 and len(out.split("\n")[:-1]) == 2 * len(lines), err
