"""MBR selection (transformer_mt.decoding.mbr, `tmt mbr`): the utility equals sacreBLEU's sentence BLEU, the choice
equals a brute-force argmax computed with sacreBLEU itself, and the candidate files are read as tmt
translate writes them, bad ones refused in one line."""

from __future__ import annotations

import random

import pytest
from sacrebleu.metrics import BLEU

from tests.conftest import head, run_cli
from transformer_mt.decoding import Candidate, MbrError, mbr_choose, mbr_files, pool_weights, read_candidates

SENT_BLEU = BLEU(effective_order=True)  # sacrebleu.sentence_bleu's settings: exp smoothing, effective order


@pytest.fixture(scope="module")
def german(multi30k) -> list[str]:
    return head(multi30k / "val.de", 300)


def _pairs(lines: list[str]) -> list[tuple[str, str]]:
    """Real sentences against each other, plus the edge cases: identical, short, empty, no overlap."""
    rng = random.Random(0)
    pairs = [(rng.choice(lines), rng.choice(lines)) for _ in range(300)]
    for line in lines[:40]:  # a sentence against a prefix, a suffix and a shuffled copy of itself
        words = line.split()
        shuffled = words[:]
        rng.shuffle(shuffled)
        pairs += [(line, " ".join(words[: len(words) // 2])), (" ".join(words[2:]), line), (" ".join(shuffled), line)]
    pairs += [
        ("Ein Hund.", "Ein Hund."),
        ("Hund", "Hund"),
        ("Hund rennt", "Hund"),
        ("Hund", "Ein Hund rennt."),
        ("", "Ein Hund."),
        ("Ein Hund.", ""),
        ("", ""),
        ("Katze", "Hund"),
        ("a b c d e", "e d c b a"),
    ]
    return pairs


def test_pairwise_utility_equals_sacrebleu_sentence_bleu(german):
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    from transformer_mt.decoding.mbr import _Ngrams, sentence_bleu_from_stats

    tok = Tokenizer13a()
    for hyp, ref in _pairs(german):
        h, r = _Ngrams(hyp, tok), _Ngrams(ref, tok)
        matches = [sum((a & b).values()) for a, b in zip(h.by_order, r.by_order)]
        expected = SENT_BLEU.sentence_score(hyp, [ref]).score
        assert sentence_bleu_from_stats(matches, h.length, r.length) == pytest.approx(expected, abs=1e-9), (hyp, ref)


def _brute_force(pool: dict[str, float]) -> tuple[str, float]:
    """argmax_h sum_r w(r) * sentence_bleu(h, r), with sacreBLEU scoring every ordered pair."""
    texts = list(pool)
    expected = [sum(pool[r] * SENT_BLEU.sentence_score(h, [r]).score for r in texts) for h in texts]
    best = max(range(len(texts)), key=lambda k: (expected[k], -k))
    return texts[best], expected[best]


def test_choice_equals_brute_force_argmax_with_sacrebleu(german):
    rng = random.Random(1)
    for _ in range(60):
        size = rng.randint(2, 9)
        texts = [rng.choice(german[:40]) for _ in range(size)]  # repeats make real consensus
        texts += [" ".join(t.split()[: rng.randint(1, 6)]) for t in texts[:2]]  # truncated variants
        pool: dict[str, float] = {}
        for t in texts:
            pool[t] = pool.get(t, 0.0) + rng.random()
        total = sum(pool.values())
        pool = {t: w / total for t, w in pool.items()}
        choice, value = mbr_choose(pool)
        want_choice, want_value = _brute_force(pool)
        assert value == pytest.approx(want_value, abs=1e-9)
        assert choice == want_choice


def test_consensus_beats_the_outlier():
    pool = pool_weights(
        [
            [Candidate("Ein Mann fährt Fahrrad .", 0.0)],
            [Candidate("Ein Mann fährt ein Fahrrad .", 0.0)],
            [Candidate("Ein Mann fährt Fahrrad .", 0.0)],
            [Candidate("Zwei Hunde spielen im Schnee .", 0.0)],
        ]
    )
    assert pool == {
        "Ein Mann fährt Fahrrad .": 0.5,
        "Ein Mann fährt ein Fahrrad .": 0.25,
        "Zwei Hunde spielen im Schnee .": 0.25,
    }
    assert mbr_choose(pool)[0] == "Ein Mann fährt Fahrrad ."


def test_pool_weights_uniform_and_score_softmax():
    import math

    a = [Candidate("x", -1.0), Candidate("y", -2.0)]
    b = [Candidate("y", -0.5), Candidate("z", -3.0), Candidate("x", -0.7)]
    uniform = pool_weights([a, b])
    assert uniform == pytest.approx({"x": 1 / 4 + 1 / 6, "y": 1 / 4 + 1 / 6, "z": 1 / 6})
    assert list(uniform) == ["x", "y", "z"]  # first appearance order: ties go to it
    t = 0.5
    za = math.exp(-1 / t) + math.exp(-2 / t)
    zb = math.exp(-0.5 / t) + math.exp(-3 / t) + math.exp(-0.7 / t)
    scored = pool_weights([a, b], weights="score", temperature=t)
    assert scored == pytest.approx(
        {
            "x": (math.exp(-1 / t) / za + math.exp(-0.7 / t) / zb) / 2,
            "y": (math.exp(-2 / t) / za + math.exp(-0.5 / t) / zb) / 2,
            "z": math.exp(-3 / t) / zb / 2,
        }
    )
    assert sum(scored.values()) == pytest.approx(1.0)
    with pytest.raises(MbrError, match="temperature"):
        pool_weights([a], weights="score", temperature=0)
    with pytest.raises(MbrError, match="uniform, score"):
        pool_weights([a], weights="bayes")


def test_read_candidates_nbest_and_plain(tmp_path):
    nbest = tmp_path / "nbest.txt"
    nbest.write_text(
        "0\t-0.5\tEin Hund.\n0\t-0.9\tEin Hund rennt.\n1\t0.0\t\n1\t0.0\t\n2\t-1.25\tZwei Katzen.\n2\t-2\tKatzen.\n",
        encoding="utf-8",
    )
    got = read_candidates(nbest)
    assert got == [
        [Candidate("Ein Hund.", -0.5), Candidate("Ein Hund rennt.", -0.9)],
        [Candidate("", 0.0)] * 2,
        [Candidate("Zwei Katzen.", -1.25), Candidate("Katzen.", -2.0)],
    ]
    plain = tmp_path / "plain.txt"
    plain.write_text("Ein Hund.\n\n3\tZwei Katzen.\n", encoding="utf-8")  # one tab only: still plain text
    assert read_candidates(plain) == [
        [Candidate("Ein Hund.", 0.0)],
        [Candidate("", 0.0)],
        [Candidate("3\tZwei Katzen.", 0.0)],
    ]


@pytest.mark.parametrize(
    "text, where, what",
    [
        ("0\t-1\ta\n2\t-1\tb\n", ":2:", "input index 2 follows 0"),
        ("0\t-1\ta\n1\t-1\tb\n0\t-1\tc\n", ":3:", "input index 0 follows 1"),
        ("0\t-1\ta\nplain line\n", ":2:", "expected INDEX<TAB>SCORE<TAB>TEXT"),
        ("0\t-1\ta\n1\tnan\tb\n", ":2:", "expected INDEX<TAB>SCORE<TAB>TEXT"),
    ],
)
def test_malformed_nbest_names_file_and_line(tmp_path, text, where, what):
    path = tmp_path / "bad.nbest"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MbrError) as err:
        read_candidates(path)
    assert f"{path}{where}" in str(err.value) and what in str(err.value)


def test_files_of_different_inputs_are_refused(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x\ny\n", encoding="utf-8")
    b.write_text("x\ny\nz\n", encoding="utf-8")
    with pytest.raises(MbrError, match=r"b.txt has candidates for 3 inputs but .*a.txt for 2"):
        mbr_files([a, b])


def test_cli_writes_one_line_per_input_and_one_error_line(tmp_path, capsys):
    sys1, sys2, sys3 = tmp_path / "s1.txt", tmp_path / "s2.nbest", tmp_path / "s3.txt"
    sys1.write_text("Ein Mann fährt Fahrrad .\n\nZwei Hunde spielen .\n", encoding="utf-8")
    sys2.write_text(
        "0\t-0.1\tEin Mann fährt ein Fahrrad .\n0\t-0.2\tEin Mann fährt Fahrrad .\n"
        "1\t0\t\n1\t0\t\n2\t-0.3\tZwei Hunde spielen im Schnee .\n2\t-0.4\tZwei Hunde spielen .\n",
        encoding="utf-8",
    )
    sys3.write_text("Ein Mann fährt Fahrrad .\n\nZwei Hunde spielen im Schnee .\n", encoding="utf-8")
    out = tmp_path / "mbr.txt"
    code, _, err = run_cli(["mbr", sys1, sys2, sys3, "-o", out], capsys)
    assert code == 0, err
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[:2] == ["Ein Mann fährt Fahrrad .", ""] and len(lines) == 4 and lines[3] == ""
    assert lines[2] in {"Zwei Hunde spielen .", "Zwei Hunde spielen im Schnee ."}
    assert lines[2] == _brute_force(pool_weights([read_candidates(p)[2] for p in (sys1, sys2, sys3)]))[0]
    code, _, err = run_cli(["mbr", sys1, tmp_path / "missing.txt"], capsys)
    assert code == 2 and err.count("\n") == 1 and "missing.txt: " in err
