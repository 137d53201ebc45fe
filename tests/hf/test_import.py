"""`tmt import --from marian-hf`: the imported model computes and decodes what transformers' MarianMT does.

The reference is transformers itself, on a MarianMTModel and MarianTokenizer it built and saved (conftest). Search
settings that make the two the same search (see docs/finetuning.md):

- length penalty: transformers divides a finished hypothesis' summed log-prob by len**length_penalty (len = generated
  tokens, EOS included), tmt by GNMT's ((5 + len) / 6)**lenpen; at 0 both rank by the plain sum;
- the length limit: max_new_tokens = L in generate, max_len_a = 0, max_len_b = L in tmt; generate's
  forced_eos_token_id (MarianConfig's default 0) is turned off, because tmt finishes a hypothesis at the limit as
  it is, without forcing EOS;
- early_stopping=False (generate's default): a sentence stops once it has num_beams finished hypotheses and the
  best open one cannot beat the worst of them, tmt's rule; EOS counts only among the top num_beams of the
  2 * num_beams candidates in both;
- the pad id (MarianMT's decoder start) is never generated: bad_words_ids in generate (OPUS-MT's configs set it),
  masked without renormalising in tmt (renormalize_logits=False).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.conftest import head, run_cli
from tests.hf.conftest import build_marian_dir, transformers
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.decoding import Translator, translate_ids

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_NEW = 24  # the length limit of both searches


# (vocabulary, activation, seed, weight scale, EOS bias): random weights whose greedy outputs differ between lines
MODELS = [("shared", "swish", 0, 0.3, 0.7), ("separate", "relu", 1, 0.5, 0.3)]


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def imported(request, multi30k, tmp_path_factory):
    """(MarianDir, the HF model, its tokenizer, the tmt Translator of the imported checkpoint, the checkpoint path)."""
    vocab, activation, seed, scale, eos_bias = request.param
    root = tmp_path_factory.mktemp(f"marian_{vocab}")
    marian = build_marian_dir(root, multi30k, shared=vocab == "shared", activation=activation, seed=seed, scale=scale, eos_bias=eos_bias)
    assert _cli(["import", marian.path, "--from", "marian-hf", "-o", root / "model.pt"]) == 0
    hf = transformers.MarianMTModel.from_pretrained(marian.path).eval()
    tok = transformers.MarianTokenizer.from_pretrained(marian.path)
    return marian, hf, tok, Translator.from_checkpoint(root / "model.pt", device="cpu"), root / "model.pt"


def _cli(argv) -> int:
    """`tmt ARGV` in this process, for module-scoped fixtures (which cannot take capsys): the exit code."""
    from transformer_mt.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    return exit_.value.code or 0


@pytest.fixture(scope="module")
def lines(multi30k) -> tuple[list[str], list[str]]:
    return head(multi30k / "test_2016_flickr.en", 32), head(multi30k / "test_2016_flickr.de", 32)


def test_tokenizer_ids_equal_marian_tokenizers(imported, lines):
    _, hf, tok, tr, _ = imported
    src, tgt = lines
    eos = hf.config.eos_token_id
    assert [ids + [eos] for ids in tr.src_tok.encode(src)] == tok(src)["input_ids"]  # MarianTokenizer appends EOS
    assert [ids + [eos] for ids in tr.tgt_tok.encode(tgt)] == tok(text_target=tgt)["input_ids"]
    tagged = [">>deu<< " + src[0]]  # a language tag is one piece (unknown here: <unk>), the rest segmented as without it
    assert tr.src_tok.encode(tagged)[0] + [eos] == tok(tagged)["input_ids"][0]


def test_teacher_forced_log_probs_equal_transformers(imported, lines):
    _, hf, tok, tr, _ = imported
    batch = tok(lines[0], text_target=lines[1], return_tensors="pt", padding=True)
    labels = batch["labels"]  # (B, T) target ids + EOS, right-padded with the pad id
    start = torch.full_like(labels[:, :1], hf.config.decoder_start_token_id)
    tgt_in = torch.cat([start, labels[:, :-1]], dim=1)  # MarianMT's shift_tokens_right: the decoder starts from pad
    with torch.inference_mode():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in).logits.log_softmax(-1)
        model = tr.model
        ours = model.decode(tgt_in, model.encode(batch["input_ids"])).log_softmax(-1)
    real = labels != hf.config.pad_token_id  # (B, T) the target positions (pad is never a target piece here)
    assert real.sum() > 300
    diff = (ours - theirs)[real].abs().max().item()
    assert diff < 1e-4
    assert torch.equal(ours[real].argmax(-1), theirs[real].argmax(-1))


def _generate(hf, tok, lines, **options) -> tuple[list[list[int]], list[float] | None]:
    """generate's best output per line (generated ids without the start and after the first EOS) and, for beam
    search, its score."""
    batch = tok(lines, return_tensors="pt", padding=True)
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    with torch.inference_mode():
        out = hf.generate(
            **batch,
            max_new_tokens=MAX_NEW,
            forced_eos_token_id=None,
            bad_words_ids=[[pad]],
            renormalize_logits=False,
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
            **options,
        )
    seqs = []
    for row in out.sequences[:, 1:].tolist():
        seqs.append(row[: row.index(eos)] if eos in row else row)
    scores = out.sequences_scores.tolist() if getattr(out, "sequences_scores", None) is not None else None
    return seqs, scores


def test_greedy_equals_generate(imported, lines):
    _, hf, tok, tr, _ = imported
    ours = translate_ids(tr.model, tr.src_tok.encode(lines[0]), beam=1, lenpen=0.0, max_len_a=0.0, max_len_b=MAX_NEW)
    theirs, _ = _generate(hf, tok, lines[0], num_beams=1)
    assert [h[0].tokens for h in ours] == theirs
    assert len({tuple(t) for t in theirs}) > 8  # a random model that says different things for different lines


def test_beam4_equals_generate_with_length_penalty_0(imported, lines):
    _, hf, tok, tr, _ = imported
    ours = translate_ids(tr.model, tr.src_tok.encode(lines[0]), beam=4, lenpen=0.0, max_len_a=0.0, max_len_b=MAX_NEW)
    theirs, scores = _generate(hf, tok, lines[0], num_beams=4, length_penalty=0.0, early_stopping=False)
    assert [h[0].tokens for h in ours] == theirs
    assert scores is not None
    assert [h[0].logprob for h in ours] == pytest.approx(scores, abs=1e-4)  # at length penalty 0 both are the summed log-prob
    assert any(len(t) < MAX_NEW for t in theirs) and any(len(t) == MAX_NEW for t in theirs)  # EOS endings and the limit


def test_translate_text_equals_marian_tokenizer_decode(imported, lines, capsys, tmp_path):
    _, hf, tok, _, ckpt = imported
    src = tmp_path / "src.en"
    src.write_text("\n".join(lines[0][:8]) + "\n", encoding="utf-8")
    code, out, err = run_cli(["translate", "-c", ckpt, src, "--beam", "1", "--lenpen", "0"], capsys)
    assert code == 0, err
    ids, _ = _generate(hf, tok, lines[0][:8], num_beams=1)
    # tmt's default longest output (a * n + b) is longer than MAX_NEW: compare the lines both ended with EOS
    ended = [i for i, t in enumerate(ids) if len(t) < MAX_NEW]
    texts = out.splitlines()
    assert len(texts) == 8
    assert [texts[i] for i in ended] == [tok.decode(ids[i], skip_special_tokens=True) for i in ended]


def test_checkpoint_is_self_contained(imported):
    marian, _, _, tr, ckpt = imported
    state = load_checkpoint(ckpt)
    assert set(state) >= {"model", "config", "tokenizers"}
    model_cfg = state["config"]["model"]
    vocab = json.loads((marian.path / "vocab.json").read_text(encoding="utf-8"))
    assert (model_cfg["eos_id"], model_cfg["unk_id"], model_cfg["pad_id"], model_cfg["bos_id"]) == (0, 1, vocab["<pad>"], -1)
    assert model_cfg["decoder_start_id"] == vocab["<pad>"]
    assert model_cfg["position_layout"] == "halves" and model_cfg["output_bias"] is True
    assert model_cfg["share_all_embeddings"] is marian.shared
    assert tr.src_tok.vocab is not None and len(tr.src_tok.vocab) == len(vocab)


def test_import_export_import_round_trip(imported, tmp_path, capsys):
    marian, hf, _, _, ckpt = imported
    code, _, err = run_cli(["export", "-c", ckpt, "--format", "marian-hf", "-o", tmp_path / "hf"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["import", tmp_path / "hf", "--from", "marian-hf", "-o", tmp_path / "again.pt"], capsys)
    assert code == 0, err
    first, second = load_checkpoint(ckpt), load_checkpoint(tmp_path / "again.pt")
    assert first["config"]["model"] == second["config"]["model"]
    assert first["model"].keys() == second["model"].keys()
    assert all(torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
    for side in ("src", "tgt"):
        assert torch.equal(first["tokenizers"][side], second["tokenizers"][side])
    assert first["tokenizers"].get("tgt_vocab") == second["tokenizers"].get("tgt_vocab")
    # and the exported directory is the original model to transformers: same tensors, same tokenizer files
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    assert all(torch.equal(p, q) for p, q in zip(hf.state_dict().values(), again.state_dict().values()))
    for name in ("vocab.json", "source.spm", "target.spm") + (() if marian.shared else ("target_vocab.json",)):
        ours, theirs = (tmp_path / "hf" / name).read_bytes(), (marian.path / name).read_bytes()
        assert (json.loads(ours) == json.loads(theirs)) if name.endswith(".json") else ours == theirs


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("normalize_before", True),
        ("add_final_layer_norm", True),
        ("scale_embedding", False),
        ("static_position_embeddings", False),
        ("layernorm_embedding", True),
        ("activation_function", "gelu_new"),
        ("decoder_ffn_dim", 48),
        ("model_type", "bart"),
    ],
)
def test_unmappable_config_refused_in_one_line(field, value, imported, tmp_path, capsys):
    marian = imported[0]
    bad = tmp_path / "bad"
    shutil.copytree(marian.path, bad)
    config = json.loads((bad / "config.json").read_text(encoding="utf-8"))
    config[field] = value
    (bad / "config.json").write_text(json.dumps(config), encoding="utf-8")
    code, _, err = run_cli(["import", bad, "--from", "marian-hf", "-o", tmp_path / "m.pt"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tmt: error: ") and "config.json" in err and field in err
    assert not (tmp_path / "m.pt").exists()


def test_weights_that_do_not_fit_refused(imported, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(imported[0].path, bad)
    weights = load_file(str(bad / "model.safetensors"))
    del weights["model.decoder.layers.1.fc2.bias"]
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = run_cli(["import", bad, "--from", "marian-hf", "-o", tmp_path / "m.pt"], capsys)
    assert code == 2 and "model.decoder.layers.1.fc2.bias" in err and err.count("\n") == 1


def test_existing_output_needs_force(imported, tmp_path, capsys):
    out = tmp_path / "m.pt"
    out.write_text("keep me")
    code, _, err = run_cli(["import", imported[0].path, "--from", "marian-hf", "-o", out], capsys)
    assert code == 2 and "--force" in err and out.read_text() == "keep me"
    code, _, err = run_cli(["import", imported[0].path, "--from", "opennmt", "-o", out], capsys)
    assert code == 2 and "marian-hf" in err


def test_without_safetensors_names_the_extra(imported, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "safetensors", None)
    monkeypatch.setitem(__import__("sys").modules, "safetensors.torch", None)
    code, _, err = run_cli(["import", imported[0].path, "--from", "marian-hf", "-o", tmp_path / "m.pt"], capsys)
    assert code == 2 and 'pip install -e ".[hf]"' in err and err.count("\n") == 1
