"""`--engine ctranslate2` (transformer_mt.export.engine and .cache): CTranslate2 decoding behind tmt's translator
interface gives tmt's own translations, and the conversion is made once and rebuilt only when stale.

Every expectation is tmt's own ``Translator.translate_batch`` on the same checkpoint and lines, computed here. A
random model (tests.conftest.make_checkpoint: outputs of at most source + 6 tokens, learned positions of 64) hits
its length limits on almost every line, which is where one CTranslate2 call with the batch's largest limit has to
be brought back to tmt's per-sentence limits; the trained tiny model checks real translations.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import head, make_checkpoint, run_cli
from transformer_mt.decoding import Translator, translate_ids
from transformer_mt.export import ExportError, ctranslate2_translator

ctranslate2 = pytest.importorskip("ctranslate2")
cache_module = pytest.importorskip("transformer_mt.export.cache")


@pytest.fixture(scope="module")
def random_ckpt(spm_model, tmp_path_factory):
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("engine") / "m.pt")


@pytest.fixture(scope="module")
def lines(multi30k) -> list[str]:
    """30 real lines, an empty and a blank one, and one longer than the random model's 63 source pieces."""
    test = head(multi30k / "test_2016_flickr.en", 40)
    return test[:15] + ["", "   "] + test[15:30] + [" ".join(test[30:40])]


def _same(ours, theirs, *, scores: bool = True, stats: bool = True) -> None:
    """Equal texts (every n-best entry, in order) and stats; scores (``scores``) within CTranslate2's kernels' rounding
    and the little probability a trained model leaves to padding and BOS (relative 1e-3: a long output sums many)."""
    assert [[t for _, t in nb] for nb in theirs.hypotheses] == [[t for _, t in nb] for nb in ours.hypotheses]
    for a, b in zip(ours.hypotheses, theirs.hypotheses) if scores else ():
        assert [s for s, _ in b] == pytest.approx([s for s, _ in a], rel=1e-3, abs=5e-3)
    for key in ("lines", "truncated", "tgt_tokens", "max_src_tokens") if stats else ():
        assert getattr(theirs.stats, key) == getattr(ours.stats, key), key


LIMITS: list[dict[str, Any]] = [
    {},
    {"max_output_tokens": 4},
    {"max_len_a": 0.5, "max_len_b": 2},
]  # the checkpoint's, a server's cap, tighter ones


def test_random_model_greedy_equals_translator_at_its_length_limits(random_ckpt, lines):
    """Greedy outputs past their own limit are cut to it. An untrained model gives BOS a large probability, which
    CTranslate2 takes out before its softmax (tmt after): the same tokens, other scores (module docstring of engine)."""
    tr = Translator.from_checkpoint(random_ckpt, device="cpu", threads=1)
    engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
    assert engine.num_parameters == tr.num_parameters and engine.max_src_tokens == tr.max_src_tokens == 63
    for extra in LIMITS:
        for lenpen in (0.0, 1.0):  # greedy: the penalty only rescales the score
            theirs = engine.translate_batch(lines, beam=1, lenpen=lenpen, **extra)
            _same(tr.translate_batch(lines, beam=1, lenpen=lenpen, **extra), theirs, scores=False)
            assert theirs.stats.truncated == 1 and theirs.hypotheses[15] == theirs.hypotheses[16] == [(0.0, "")]
    assert engine.translate_batch([], beam=1, lenpen=0.0).hypotheses == []
    assert engine.translate_batch(["", " "], beam=3, lenpen=0.0, nbest=2).hypotheses == [[(0.0, "")] * 2] * 2


def test_without_scores_the_same_text_and_nan_scores(random_ckpt, lines):
    """``scores=False`` (what `tmt translate` asks for one best): the texts and stats of ``scores=True``, greedy outputs
    cut to their limits included, and NaN for every decoded line's score; n-best lists keep their scores."""
    engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
    for beam in (1, 3):
        for extra in LIMITS:
            scored = engine.translate_batch(lines, beam=beam, lenpen=0.0, **extra)
            bare = engine.translate_batch(lines, beam=beam, lenpen=0.0, scores=False, **extra)
            _same(scored, bare, scores=False)
            decoded = [nb[0][0] for line, nb in zip(lines, bare.hypotheses) if line.strip()]
            assert len(decoded) == len(lines) - 2 and all(math.isnan(s) for s in decoded)
    nbest = engine.translate_batch(lines, beam=3, lenpen=0.0, nbest=2, scores=False)
    assert all(not math.isnan(s) for nb in nbest.hypotheses for s, _ in nb)


def test_engine_refuses_what_it_cannot_map(random_ckpt, lines):
    engine = ctranslate2_translator([random_ckpt], device="cpu", threads=1)
    with pytest.raises(ExportError, match="not an ensemble of 2; use --engine tmt"):
        ctranslate2_translator([random_ckpt, random_ckpt], device="cpu")
    with pytest.raises(ExportError, match="--dtype bfloat16 applies to --engine tmt"):
        ctranslate2_translator([random_ckpt], dtype="bfloat16", device="cpu")
    with pytest.raises(ExportError, match="--compute-type int3: CTranslate2 on cpu supports"):
        ctranslate2_translator([random_ckpt], compute_type="int3", device="cpu")
    if not ctranslate2.get_cuda_device_count():
        with pytest.raises(ExportError, match="--device cuda: this CTranslate2 build sees no CUDA device"):
            ctranslate2_translator([random_ckpt], device="cuda")
    with pytest.raises(ExportError, match="--device mps: --engine ctranslate2 runs on cpu or cuda"):
        ctranslate2_translator([random_ckpt], device="mps")
    with pytest.raises(Exception, match="beam"):
        engine.translate_batch(lines, beam=0, lenpen=0.0)
    with pytest.raises(Exception, match="allow outputs longer than the .* positions"):
        engine.translate_batch(lines, beam=1, lenpen=0.0, max_len_b=500)


def _counting(monkeypatch) -> list:
    """Record every conversion the cache makes (and still make it)."""
    calls: list = []
    real = cache_module.export_ctranslate2

    def export(ckpt, out, **kw):
        calls.append(out)
        return real(ckpt, out, **kw)

    monkeypatch.setattr(cache_module, "export_ctranslate2", export)
    return calls


def test_cache_is_reused_and_rebuilt_only_when_stale(random_ckpt, spm_model, lines, tmp_path, monkeypatch):
    ckpt = tmp_path / "m.pt"
    shutil.copy(random_ckpt, ckpt)
    calls = _counting(monkeypatch)
    first = cache_module.cached_model(ckpt)
    assert first.path == tmp_path / "m.pt.ct2" and first.note.startswith("converted") and len(calls) == 1
    key = first.notes["converted_from"]
    assert (
        key["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest() and key["ctranslate2"] == ctranslate2.__version__
    )
    again = cache_module.cached_model(ckpt)
    assert again.path == first.path and again.note is None and len(calls) == 1  # reused: no conversion
    # the same content with new times (a copy, a touch): the sha256 keeps the cache, and its times are refreshed
    os.utime(ckpt, ns=(key["mtime_ns"] + 10**9, key["mtime_ns"] + 10**9))
    assert cache_module.cached_model(ckpt).note is None and len(calls) == 1
    assert (
        json.loads((first.path / "tmt_export.json").read_text())["converted_from"]["mtime_ns"]
        == key["mtime_ns"] + 10**9
    )
    # other weights in the same file: converted again, and decoded as tmt decodes the new checkpoint
    make_checkpoint(spm_model, ckpt, seed=1)
    engine = ctranslate2_translator([ckpt], device="cpu", threads=1)
    assert len(calls) == 2 and engine.note is not None and engine.note.startswith("converted")
    ours = Translator.from_checkpoint(ckpt, device="cpu", threads=1).translate_batch(lines, beam=1, lenpen=0.0)
    _same(ours, engine.translate_batch(lines, beam=1, lenpen=0.0), scores=False)  # scores: see the greedy test
    # written by another tmt version: rebuilt
    marker = first.path / "tmt_export.json"
    notes = json.loads(marker.read_text())
    notes["converted_from"]["transformer_mt"] = "0.0.1"
    marker.write_text(json.dumps(notes))
    cache_module.cached_model(ckpt)
    assert len(calls) == 3
    # --weights picks its own directory (the raw weights of a checkpoint without EMA: the same model, cached apart)
    assert cache_module.cached_model(ckpt, weights="raw").path == tmp_path / "m.pt.raw.ct2" and len(calls) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "m.pt.ct2", "m.pt.raw.ct2"]  # no temporary left


def test_read_only_directory_caches_in_the_user_cache(random_ckpt, tmp_path, monkeypatch):
    ckpt = tmp_path / "ro" / "m.pt"
    ckpt.parent.mkdir()
    shutil.copy(random_ckpt, ckpt)
    monkeypatch.setenv("TMT_CACHE_DIR", str(tmp_path / "user"))
    real = cache_module.export_ctranslate2

    def export(path, out, **kw):  # what writing into a read-only directory raises (root ignores chmod)
        if out.parent == ckpt.parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(out))
        return real(path, out, **kw)

    monkeypatch.setattr(cache_module, "export_ctranslate2", export)
    made = cache_module.cached_model(ckpt)
    assert made.path.parent == tmp_path / "user" / "ctranslate2" and made.path.name.endswith("-m.pt.ct2")
    assert made.note == f"{ckpt.parent} is not writable: the CTranslate2 conversion of m.pt is cached in {made.path}"
    assert cache_module.cached_model(ckpt).path == made.path and cache_module.cached_model(ckpt).note is None
    (tmp_path / "mine.pt.ct2").mkdir()  # a directory of the user's own where the cache would go: never replaced
    shutil.copy(random_ckpt, tmp_path / "mine.pt")
    elsewhere = cache_module.user_cache_dir(tmp_path / "mine.pt", weights=None)
    elsewhere.mkdir(parents=True)  # and one in the user cache too: nowhere left to convert into
    (elsewhere / "notes.txt").write_text("mine")
    with pytest.raises(
        ExportError,
        match=r"-mine.pt.ct2: not a conversion .* and .*mine.pt.ct2 is not a conversion .* move one of them away",
    ) as refused:
        cache_module.cached_model(tmp_path / "mine.pt")
    assert (
        "\n" not in str(refused.value)
        and not list((tmp_path / "mine.pt.ct2").iterdir())
        and (elsewhere / "notes.txt").read_text() == "mine"
    )


def test_the_cache_never_replaces_an_export_the_user_made_at_its_path(random_ckpt, tmp_path, monkeypatch, capsys):
    """`tmt export -o CKPT.ct2 -q int8` is the user's: the engine converts into the user cache instead, and says so."""
    monkeypatch.setenv("TMT_CACHE_DIR", str(tmp_path / "user"))
    ckpt = tmp_path / "m.pt"
    shutil.copy(random_ckpt, ckpt)
    mine = tmp_path / "m.pt.ct2"
    assert run_cli(["export", "-c", ckpt, "-o", mine, "-q", "int8"], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    made = cache_module.cached_model(ckpt)
    assert made.path == cache_module.user_cache_dir(ckpt, weights=None) and made.notes["quantization"] == "float32"
    assert made.note is not None and str(mine) in made.note and str(made.path) in made.note and "\n" not in made.note
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before  # the int8 export is left as it was
    assert cache_module.cached_model(ckpt).path == made.path  # and the conversion is found there next time
    # a cache the engine wrote, whose files the user changed afterwards, is not replaced either when it goes stale
    other = tmp_path / "o.pt"
    shutil.copy(random_ckpt, other)
    cached = cache_module.cached_model(other)
    assert cached.path == tmp_path / "o.pt.ct2"
    (cached.path / "notes.txt").write_text("mine")
    marker = cached.path / "tmt_export.json"
    notes = json.loads(marker.read_text())
    notes["converted_from"]["transformer_mt"] = "0.0.1"  # stale: written by another tmt version
    marker.write_text(json.dumps(notes))
    rebuilt = cache_module.cached_model(other)
    assert (
        rebuilt.path == cache_module.user_cache_dir(other, weights=None)
        and (cached.path / "notes.txt").read_text() == "mine"
    )


def test_cli_engine_option(random_ckpt, lines, tmp_path, capsys, monkeypatch, multi30k):
    ckpt = tmp_path / "m.pt"
    shutil.copy(random_ckpt, ckpt)
    src = tmp_path / "src.en"
    src.write_text("\n".join(lines) + "\n")
    common = ["-c", ckpt, "--beam", 3, "--lenpen", 0, "--threads", 1, "--device", "cpu"]
    assert run_cli(["translate", *common, src, "-o", tmp_path / "tmt.hyp"], capsys)[0] == 0
    code, _, err = run_cli(["translate", *common, "--engine", "ctranslate2", src, "-o", tmp_path / "ct2.hyp"], capsys)
    assert code == 0 and err.startswith(f"tmt: converted {ckpt} for CTranslate2 into {ckpt}.ct2")
    assert (tmp_path / "ct2.hyp").read_text() == (tmp_path / "tmt.hyp").read_text()
    code, _, err = run_cli(
        ["translate", *common, "--engine", "ctranslate2", "--compute-type", "int8", "--nbest", 2, src], capsys
    )
    assert code == 0 and "converted" not in err  # the cache is reused
    ref = tmp_path / "ref.de"  # as many lines as src (their content only sets the score, the same for both engines)
    ref.write_text("\n".join(head(multi30k / "test_2016_flickr.de", len(lines))) + "\n")
    scores = []
    for engine in ("tmt", "ctranslate2"):
        code, out, _ = run_cli(
            [
                "evaluate",
                *common,
                "--engine",
                engine,
                "--src",
                src,
                "--ref",
                ref,
                "-o",
                tmp_path / f"{engine}.eval",
                "--json",
            ],
            capsys,
        )
        assert code == 0
        scores.append(json.loads(out)["bleu"])
    assert scores[0] == scores[1] and (tmp_path / "tmt.eval").read_text() == (tmp_path / "ctranslate2.eval").read_text()
    for argv, message in (
        (["--engine", "onnx"], "--engine onnx: choose tmt or ctranslate2"),
        (
            ["--compute-type", "int8"],
            "--compute-type int8 applies to --engine ctranslate2; tmt's own search takes --dtype",
        ),
        (["--engine", "ctranslate2", "-c", ckpt], "--engine ctranslate2 decodes one checkpoint, not an ensemble of 2"),
    ):
        code, _, err = run_cli(["translate", *common, *argv, src], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith(f"tmt: error: {message}")
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # what `import ctranslate2` meets without the extra
    code, _, err = run_cli(["translate", *common, "--engine", "ctranslate2", src], capsys)
    assert code == 2 and err == 'tmt: error: ctranslate2 is not installed; run: pip install -e ".[export]"\n'


def _parts_at_near_ties(tr, engine, lines: list[str], ours, theirs, *, beam: int, gap: float = 1e-3) -> list[int]:
    """The lines whose outputs differ, each checked first: the two engines' hypotheses (full length, lenpen 0; greedy
    where ``beam`` is 1) part at a step where CTranslate2 itself gives the two next pieces log-probabilities within
    ``gap``: float rounding decided a near-tie of the trained model, which both engines compute with sums in their own
    order."""
    differing = [i for i, (a, b) in enumerate(zip(ours.hypotheses, theirs.hypotheses)) if a[0][1] != b[0][1]]
    d = tr.cfg.decode
    for i in differing:
        src_ids = tr.src_tok.encode([lines[i]])[0]
        src = [tr.src_tok.id_to_piece(t) for t in src_ids] + [engine.eos]
        hyp = translate_ids(tr.model, [src_ids], beam=beam, lenpen=0.0, max_len_a=d.max_len_a, max_len_b=d.max_len_b)[
            0
        ][0]
        mine = [tr.tgt_tok.id_to_piece(t) for t in hyp.tokens] + [engine.eos]
        options = dict(beam_size=beam, num_hypotheses=1, max_batch_size=4096, batch_type="tokens", return_scores=True)
        other = [t for t in engine._decode([src], len(mine) + 50, options)[0][0][0] if t != engine.eos] + [engine.eos]
        j = next(j for j, (a, b) in enumerate(zip(mine, other)) if a != b)  # both end in EOS: they part somewhere
        prefixes = [
            mine[:j] if mine[j] == engine.eos else mine[: j + 1],
            other[:j] if other[j] == engine.eos else other[: j + 1],
        ]
        scored = engine.ct.score_batch([src, src], prefixes, max_input_length=0)  # log_probs end with EOS's
        assert abs(scored[0].log_probs[j] - scored[1].log_probs[j]) < gap, (lines[i], mine[: j + 1], other[: j + 1])
    return differing


def test_trained_model_equals_translator_on_real_sentences(tiny_checkpoint, multi30k, tmp_path):
    """Greedy and beam 4 at lenpen 0 give tmt's hypotheses and scores (greedy within tighter per-sentence length limits
    too, beam most of them there); at lenpen 1 (CTranslate2's n-best re-ranked with tmt's penalty) most of them."""
    ckpt = tmp_path / "tiny.pt"
    shutil.copy(tiny_checkpoint, ckpt)
    lines = head(multi30k / "test_2016_flickr.en", 100)
    tr = Translator.from_checkpoint(ckpt, device="cpu", threads=1)
    engine = ctranslate2_translator([ckpt], device="cpu", threads=1)
    parted: list[int] = []  # lines whose outputs part at a near-tie (checked), left out of the comparisons
    ours: Any  # a TranslationResult, then its hypotheses without the parted lines, then n-best lists
    theirs: Any
    for beam in (1, 4):
        for extra in LIMITS:
            ours, theirs = (
                tr.translate_batch(lines, beam=beam, lenpen=0.0, **extra),
                engine.translate_batch(lines, beam=beam, lenpen=0.0, **extra),
            )
            if beam == 1:
                parted = sorted(set(parted) | set(_parts_at_near_ties(tr, engine, lines, ours, theirs, beam=beam)))
                assert len(parted) <= 2, parted
            elif not extra:
                # tmt's beam search and CTranslate2's agree wherever the model is sure of its outputs, but may part on
                # the degenerate lines of this barely trained model (a piece repeated towards the length limit), where
                # EOS ranks near the beam's edge: the two searches finish hypotheses differently (tmt's, fairseq's,
                # ranks 2 x beam candidates a step and stops when no open hypothesis can win; CTranslate2 stops once
                # `beam` have finished: module docstring of engine). A few of the 100 lines may differ so
                # (test_2016_flickr lines 8 and 85 with this tiny model, one engine's output running on where the
                # other's ends); the trained recipe's 1,000 lines are all the same at beam 5 (docs/benchmarks.md).
                beam_parted = [
                    i
                    for i, (a, b) in enumerate(zip(ours.hypotheses, theirs.hypotheses))
                    if a[0][1] != b[0][1] and i not in parted
                ]
                assert len(beam_parted) <= 3, beam_parted
                parted = sorted(set(parted) | set(beam_parted))
            if beam == 1 or not extra:
                if parted:
                    ours, theirs = (
                        SimpleNamespace(
                            hypotheses=[h for i, h in enumerate(r.hypotheses) if i not in parted], stats=r.stats
                        )
                        for r in (ours, theirs)
                    )
                _same(ours, theirs, stats=not parted)
                continue
            # Tight limits at beam: an output past its line's limit is decoded again with it (exactly tmt's), but a
            # line where tmt's limit makes a cut-off open beam beat the shorter hypothesis found is left as found.
            same = [a[0][1] == b[0][1] for a, b in zip(ours.hypotheses, theirs.hypotheses)]
            assert sum(same) >= 90, (extra, sum(same))
    ours = tr.translate_batch(lines, beam=4, lenpen=1.0, nbest=4).hypotheses
    theirs = engine.translate_batch(lines, beam=4, lenpen=1.0, nbest=4).hypotheses
    assert all(len(nb) == 4 and [s for s, _ in nb] == sorted((s for s, _ in nb), reverse=True) for nb in theirs)
    same = [a[0][1] == b[0][1] for a, b in zip(ours, theirs)]
    assert sum(same) >= 90, sum(same)
    for a, b, equal in zip(ours, theirs, same):
        if equal:  # tmt's score of the same hypothesis: the penalty is tmt's
            assert b[0][0] == pytest.approx(a[0][0], rel=1e-3, abs=5e-3)
