"""`tmt explore`'s JSON API, in process (FastAPI's TestClient), on a random and on the tiny trained checkpoint.

Expectations come from elsewhere than the explorer: `tmt translate` and `tmt attention` on the command line (files
written by the commands), a Translator loaded apart, the GNMT formula and the sinusoid formula written out here,
and torch's cross-entropy on the model's own forward. The random model never emits EOS (its outputs stop at the
length limit), the trained one does: both ends of a hypothesis are covered.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import make_checkpoint, run_cli

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient

from transformer_mt.data import collate
from transformer_mt.decoding import Translator
from transformer_mt.explore.server import build

pytestmark = pytest.mark.usefixtures("one_thread")
SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow near a red house."]


def gnmt(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha  # Wu et al. 2016, eq. 14


@pytest.fixture(scope="module")
def random_ckpt(spm_model, tmp_path_factory):
    return make_checkpoint(spm_model, tmp_path_factory.mktemp("explore") / "random.pt", positions="sinusoidal")


@pytest.fixture(scope="module")
def random_client(random_ckpt):
    app, _ = build([f"rand={random_ckpt}"], threads=1)
    return TestClient(app)


@pytest.fixture(scope="module")
def trained(tiny_run):
    """The tiny run's last checkpoint and its update-75 one, under names."""
    app, _ = build([f"late={tiny_run.checkpoint}", f"early={tiny_run.run_dir / 'checkpoint_75.pt'}"], threads=1)
    return TestClient(app), tiny_run


def test_bad_requests_get_one_line_4xx(random_client):
    cases = [
        ({"text": ""}, 422, "text: empty"),
        ({"text": "   "}, 422, "text: empty"),
        ({"text": "x" * 1001}, 413, "more than --max-chars 1000"),
        ({"text": "a " * 200}, 413, "pieces, more than this model's 63"),
        ({"text": "a\nb"}, 422, "line break"),
        ({"text": "A dog.", "checkpoint": "nope"}, 404, "'nope' is not loaded; choose one of 'rand'"),
        ({"text": "A dog.", "beam": 0}, 422, "beam: 0 is out of range"),
        ({"text": "A dog.", "beam": 17}, 422, "use 1 (greedy) to 16"),
        ({"text": "A dog.", "beam": "4"}, 422, "beam: "),
        ({"text": "A dog.", "lenpen": 11.0}, 422, "lenpen: 11.0 is out of range"),
        ({"text": "A dog.", "colour": 1}, 422, "colour: unknown field"),
        ({}, 422, "text: missing"),
    ]
    for body, status, words in cases:
        for path in ("/api/translate", "/api/beam", "/api/attention", "/api/anatomy"):
            r = random_client.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            error = r.json()["error"]
            assert words in error and "\n" not in error, (path, body, error)
    r = random_client.post("/api/attention", json={"text": "A dog.", "reference": ""})
    assert r.status_code == 422 and r.json()["error"].startswith("reference: empty")
    r = random_client.get("/api/nothing")
    assert r.status_code == 404 and "/docs" in r.json()["error"]
    assert (
        random_client.post("/api/translate", content=b"{", headers={"Content-Type": "application/json"}).status_code
        == 422
    )
    assert random_client.post("/api/translate", json={"text": "A dog."}).status_code == 200  # still serving


def test_checkpoints_by_name_never_by_path(random_client, random_ckpt):
    text = random_client.get("/api/checkpoints").text
    info = json.loads(text)
    assert info["default"] == "rand" and [c["name"] for c in info["checkpoints"]] == ["rand"]
    assert str(random_ckpt.parent) not in text and "random.pt" not in text
    assert random_client.get("/api/examples").json() == {"file": "", "sentences": []}  # a config without valid_src here


def test_page_and_its_files_are_served(random_client):
    page = random_client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for src in ("/static/explore.js", "/static/heatmap.js", "/static/explore.css"):
        assert src in page.text and random_client.get(src).status_code == 200
    assert "http" not in page.text.replace('href="/docs"', "")  # nothing from outside: works offline
    assert "/api/translate" in random_client.get("/openapi.json").text


@pytest.mark.parametrize("beam,lenpen", [(1, 0.0), (3, 0.6), (4, 1.0)])
def test_translation_is_the_translators_and_probabilities_add_up(random_client, random_ckpt, beam, lenpen):
    tr = Translator.from_checkpoint(random_ckpt, device="cpu")
    for text in SENTENCES:
        out = random_client.post("/api/translate", json={"text": text, "beam": beam, "lenpen": lenpen}).json()
        assert out["translation"] == tr.translate(text, beam=beam, lenpen=lenpen)
        generated = [t for t in out["tokens"] if t["in_output"]]
        assert math.isclose(sum(t["logprob"] for t in generated), out["logprob"], rel_tol=1e-4, abs_tol=1e-4)
        length = len(generated)  # EOS counted when the output has one
        assert math.isclose(out["score"], out["logprob"] / gnmt(length, lenpen), rel_tol=1e-5)
        for t in out["tokens"]:
            probs = [a["prob"] for a in t["alternatives"]]
            assert (
                probs == sorted(probs, reverse=True)
                and t["prob"] <= probs[0] + 1e-9
                and math.isclose(t["loss"], -math.log(t["prob"]), rel_tol=1e-6)
            )


def test_attention_rows_sum_to_one_and_decoder_is_causal(random_client):
    out = random_client.post("/api/attention", json={"text": SENTENCES[1]}).json()
    s, t = len(out["src_pieces"]), len(out["tgt_in_pieces"])
    for kind, shape in (("encoder_self", (s, s)), ("decoder_self", (t, t)), ("cross", (t, s))):
        w = torch.tensor(out[kind])  # (L, H, Q, K)
        assert tuple(w.shape[2:]) == shape
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:3]), atol=1e-5)
    dec = torch.tensor(out["decoder_self"])  # (L, H, T, T)
    below = torch.ones(t, t, dtype=torch.bool).tril()  # position q sees inputs <= q
    assert torch.all(dec[..., ~below] == 0) and torch.all(dec[..., below] > 0)


def test_reference_loss_is_cross_entropy(random_client, random_ckpt):
    src, ref = SENTENCES[0], "Ein Mann fährt Fahrrad."
    out = random_client.post("/api/attention", json={"text": src, "reference": ref}).json()
    assert out["teacher_forced"] and out["target"] == ref
    tr = Translator.from_checkpoint(random_ckpt, device="cpu")
    batch = collate([(tr.src_tok.encode([src])[0], tr.tgt_tok.encode([ref])[0])])
    with torch.no_grad():
        losses = F.cross_entropy(tr.model(batch.src, batch.tgt_in)[0], batch.tgt_out[0], reduction="none")  # (T,)
    assert torch.allclose(torch.tensor([t["loss"] for t in out["tokens"]]), losses, atol=1e-4)
    assert math.isclose(out["mean_loss"], float(losses.mean()), rel_tol=1e-5)


def test_anatomy_masks_shapes_and_positions(random_client):
    out = random_client.post("/api/anatomy", json={"text": SENTENCES[1], "batch_with": "A dog."}).json()
    b, s, t = out["batch"]["B"], out["batch"]["S"], out["batch"]["T"]
    assert b == 2
    short = len([p for p in out["src_pieces"][1] if p != "<pad>"])  # the second sentence: pieces + </s>, then padding
    assert out["masks"]["src_pad"][1] == [False] * short + [True] * (s - short)
    assert out["masks"]["src_pad"][0] == [False] * s
    dec, tgt_pad = out["masks"]["decoder_allowed"], out["masks"]["tgt_pad"]
    for row in range(b):
        for q in range(t):
            if tgt_pad[row][q]:
                continue
            assert dec[row][q] == [k <= q and not tgt_pad[row][k] for k in range(t)]
    h, dk = out["heads"]["H"], out["heads"]["Dk"]
    cross = next(m for m in out["modules"] if m["name"].endswith("cross_attn"))
    assert (
        f"Q (B, H, T, Dk) = ({b}, {h}, {t}, {dk})" in cross["details"][0]
        and f"K (B, H, S, Dk) = ({b}, {h}, {s}, {dk})" in cross["details"][0]
    )
    pe = out["positions"]
    assert pe["n"] == max(s, t) and pe["layout"] == "interleaved"
    for pos, row in enumerate(pe["table"]):  # section 3.5: dimension 0 is sin(pos), dimension 1 cos(pos)
        assert math.isclose(row[0], math.sin(pos), abs_tol=1e-4) and math.isclose(row[1], math.cos(pos), abs_tol=1e-4)


@pytest.mark.parametrize("beam,lenpen", [(2, 0.6), (4, 1.0), (3, 0.0)])
def test_beam_steps_agree_with_the_final_nbest(random_client, random_ckpt, beam, lenpen):
    tr = Translator.from_checkpoint(random_ckpt, device="cpu")
    text = SENTENCES[1]
    out = random_client.post("/api/beam", json={"text": text, "beam": beam, "lenpen": lenpen}).json()
    steps = out["steps"]
    assert steps and steps[-1]["done"] and not any(st["done"] for st in steps[:-1])
    for prev, st in zip(
        steps, steps[1:]
    ):  # every open hypothesis extends one of the step before, by one piece, at a log-prob cost
        for h in st["open"]:
            parent = prev["open"][h["from_beam"]]
            assert h["tokens"] == parent["tokens"] + [h["appended"]] and h["logprob"] <= parent["logprob"] + 1e-6
    for st in steps:
        assert [h["logprob"] for h in st["open"]] == sorted((h["logprob"] for h in st["open"]), reverse=True)
        for f in st["finished"]:
            assert math.isclose(f["score"], f["logprob"] / gnmt(f["length"], lenpen), rel_tol=1e-5)
    expected = tr.translate(text, beam=beam, lenpen=lenpen, nbest=beam)  # [(score, text)], an independent search
    assert isinstance(expected, list)
    final = steps[-1]["finished"]
    assert [round(f["score"], 4) for f in final] == [round(sc, 4) for sc, _ in expected]
    assert tr.tgt_tok.decode([final[0]["ids"]])[0] == expected[0][1] == out["translation"]
    assert out["winner"]["tokens"] == final[0]["tokens"] and "highest score" in out["winner"]["why"]


@pytest.mark.slow
def test_trained_translation_attention_and_beam_match_the_commands(trained, tmp_path, capsys):
    client, run = trained
    src = tmp_path / "src.en"
    src.write_text(SENTENCES[0] + "\n", encoding="utf-8")
    code, _, err = run_cli(
        [
            "translate",
            "-c",
            run.checkpoint,
            "--beam",
            "3",
            "--lenpen",
            "1.0",
            src,
            "-o",
            tmp_path / "hyp",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    expected = (tmp_path / "hyp").read_text(encoding="utf-8").rstrip("\n")
    out = client.post("/api/translate", json={"text": SENTENCES[0], "beam": 3, "lenpen": 1.0}).json()
    assert out["translation"] == expected and out["ended_with_eos"]
    beam = client.post("/api/beam", json={"text": SENTENCES[0], "beam": 3, "lenpen": 1.0}).json()
    assert beam["translation"] == expected
    for ref in (None, "Ein Mann fährt ein Fahrrad."):
        args = ["attention", "-c", run.checkpoint, "--src", SENTENCES[0], "-o", tmp_path / "att"] + (
            ["--ref", ref] if ref else []
        )
        code, _, err = run_cli(args, capsys)
        assert code == 0, err
        cli = json.loads((tmp_path / "att" / "attention.json").read_text(encoding="utf-8"))
        api = client.post("/api/attention", json={"text": SENTENCES[0], "reference": ref}).json()
        for key in (
            "source",
            "target",
            "teacher_forced",
            "src_pieces",
            "tgt_in_pieces",
            "tgt_out_pieces",
            "heads",
            "encoder_layers",
            "decoder_layers",
        ):
            assert api[key] == cli[key], key
        for kind in ("encoder_self", "decoder_self", "cross"):
            assert torch.allclose(torch.tensor(api[kind]), torch.tensor(cli[kind]), atol=1e-6), kind


@pytest.mark.slow
def test_two_checkpoints_and_the_default_examples(trained):
    client, run = trained
    info = client.get("/api/checkpoints").json()
    assert info["default"] == "late" and [c["name"] for c in info["checkpoints"]] == ["late", "early"]
    early = Translator.from_checkpoint(run.run_dir / "checkpoint_75.pt", device="cpu")
    out = client.post("/api/translate", json={"text": SENTENCES[1], "checkpoint": "early"}).json()
    assert out["checkpoint"] == "early" and out["translation"] == early.translate(SENTENCES[1])
    # The run's data.valid_src is a file of this session, but the page offers only what --examples names.
    assert client.get("/api/examples").json() == {"file": "", "sentences": []}
    app, _ = build([str(run.checkpoint)], examples=run.corpus["val.en"], threads=1)
    examples = TestClient(app).get("/api/examples").json()
    assert examples["file"] == run.corpus["val.en"].name
    assert (
        examples["sentences"]
        == run.corpus["val.en"].read_text(encoding="utf-8").splitlines()[: len(examples["sentences"])]
    )


def test_a_checkpoint_cannot_make_the_page_serve_a_file(random_ckpt, tmp_path, monkeypatch):
    from transformer_mt.checkpoint import load_checkpoint, save_checkpoint

    secret = tmp_path / "environ"
    secret.write_text("AWS_SECRET_ACCESS_KEY=hunter2\n", encoding="utf-8")
    state = load_checkpoint(random_ckpt)
    # as a stranger could name /proc/self/environ
    state["config"]["data"].update(valid_src=str(secret), valid_tgt=str(secret))
    crafted = save_checkpoint(state, tmp_path / "crafted.pt")
    opened: list[str] = []
    real_open = open

    def recording_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", recording_open)
    app, _ = build([str(crafted)], threads=1)
    answer = TestClient(app).get("/api/examples")
    assert "hunter2" not in answer.text and answer.json() == {"file": "", "sentences": []}
    assert str(secret) not in opened


def test_an_answer_too_large_is_refused_and_the_page_keeps_answering(random_ckpt):
    from transformer_mt.explore.session import Limits

    sentence = "a b c d e f g h i j k l"
    app, _ = build([str(random_ckpt)], threads=1)
    client = TestClient(app)
    small = client.post("/api/attention", json={"text": sentence, "beam": 1}).json()
    held = sum(torch.tensor(small[k]).numel() for k in ("encoder_self", "decoder_self", "cross"))
    app, _ = build([str(random_ckpt)], threads=1, limits=Limits(max_attention=held - 1))
    client = TestClient(app)
    refused = client.post("/api/attention", json={"text": sentence, "beam": 1})
    assert (
        refused.status_code == 413
        and f"{held:,} weights" in refused.json()["error"]
        and "--max-attention" in refused.json()["error"]
    )
    assert client.post("/api/attention", json={"text": "a b", "beam": 1}).status_code == 200


def test_a_body_over_the_cap_is_refused_unread(random_client):
    from transformer_mt.explore.guard import body_cap

    cap = body_cap(1000)
    answer = random_client.post(
        "/api/translate", content=b'{"text": "' + b"a" * cap + b'"}', headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413 and "more than" in answer.json()["error"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(cap // 65536 + 2):
            yield b" " * 65536

    answer = random_client.post("/api/translate", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413
    assert random_client.post("/api/translate", json={"text": "a dog", "beam": 1}).status_code == 200


def test_a_foreign_host_is_refused(random_ckpt):
    from transformer_mt.serve import allowed_hosts

    app, _ = build([str(random_ckpt)], threads=1, allowed=allowed_hosts("127.0.0.1", 8000))
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    assert client.get("/api/examples").status_code == 200
    assert client.get("/api/examples", headers={"host": "localhost:8000"}).status_code == 200
    rebound = client.get("/api/examples", headers={"host": "attacker.example:8000"})
    assert rebound.status_code == 421 and "--allowed-host" in rebound.json()["error"]


def test_a_bind_beyond_this_machine_is_warned(random_ckpt, monkeypatch, capsys):
    from transformer_mt.explore import server

    monkeypatch.setattr(
        "transformer_mt.serve.server.build_server", lambda *a, **k: type("S", (), {"run": lambda self: None})()
    )
    server.explore([str(random_ckpt)], host="0.0.0.0", port=0, threads=1)  # port 0: never one in use
    assert "tmt: warning: --host 0.0.0.0 accepts connections from other machines" in capsys.readouterr().err
    server.explore([str(random_ckpt)], host="127.0.0.1", port=0, threads=1)
    assert "warning" not in capsys.readouterr().err


def test_command_line_refuses_in_one_line(random_ckpt, tmp_path, capsys):
    for args, words in (
        (["-c", random_ckpt, "--port", "70000"], "--port 70000: must be 0 to 65535"),
        (["-c", tmp_path / "missing.pt"], "missing.pt"),
        (["-c", f"a={random_ckpt}", "-c", f"a={random_ckpt}"], "a checkpoint named 'a' is already loaded"),
        (["-c", random_ckpt, "--max-chars", "0"], "--max-chars 0: must be at least 1"),
        (["-c", random_ckpt, "--allowed-host", "http://x/"], "--allowed-host"),
    ):
        # port 0 unless the row is about the port: 8000 may be taken on the machine running the tests
        code, out, err = run_cli(["explore", *(args if "--port" in args else [*args, "--port", "0"])], capsys)
        assert code == 2 and err.startswith("tmt: error: ") and words in err and err.count("\n") == 1, (args, err)
