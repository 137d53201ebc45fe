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
from tests.hf.conftest import build_marian_dir, copy_marian, edit_json, transformers
from tests.hostile import assert_refused_in_one_line, memory_limit, run_tmt
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.decoding import Translator, translate_ids

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["memory_limit"]  # the fixture, used by name
MAX_NEW = 24  # the length limit of both searches


# (vocabulary, activation, seed, weight scale, EOS bias): random weights whose greedy outputs differ between lines
MODELS = [("shared", "swish", 0, 0.3, 0.7), ("separate", "relu", 1, 0.5, 0.3)]


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def imported(request, multi30k, tmp_path_factory):
    """(MarianDir, the HF model, its tokenizer, the tmt Translator of the imported checkpoint, the checkpoint path)."""
    vocab, activation, seed, scale, eos_bias = request.param
    root = tmp_path_factory.mktemp(f"marian_{vocab}")
    marian = build_marian_dir(
        root, multi30k, shared=vocab == "shared", activation=activation, seed=seed, scale=scale, eos_bias=eos_bias
    )
    assert _cli(["import", marian.path, "--from", "marian-hf", "-o", root / "model.pt"]) == 0
    hf = transformers.MarianMTModel.from_pretrained(marian.path).eval()
    tok = transformers.MarianTokenizer.from_pretrained(marian.path)
    return marian, hf, tok, Translator.from_checkpoint(root / "model.pt", device="cpu"), root / "model.pt"


def _cli(argv) -> int:
    """`tmt ARGV` in this process, for module-scoped fixtures (which cannot take capsys): the exit code."""
    from transformer_mt.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    code = exit_.value.code
    assert code is None or isinstance(code, int), code
    return code or 0


@pytest.fixture(scope="module")
def lines(multi30k) -> tuple[list[str], list[str]]:
    return head(multi30k / "test_2016_flickr.en", 32), head(multi30k / "test_2016_flickr.de", 32)


def test_tokenizer_ids_equal_marian_tokenizers(imported, lines):
    _, hf, tok, tr, _ = imported
    src, tgt = lines
    eos = hf.config.eos_token_id
    assert [ids + [eos] for ids in tr.src_tok.encode(src)] == tok(src)["input_ids"]  # MarianTokenizer appends EOS
    assert [ids + [eos] for ids in tr.tgt_tok.encode(tgt)] == tok(text_target=tgt)["input_ids"]
    tagged = [
        ">>deu<< " + src[0]
    ]  # a language tag is one piece (unknown here: <unk>), the rest segmented as without it
    assert tr.src_tok.encode(tagged)[0] + [eos] == tok(tagged)["input_ids"][0]


def test_teacher_forced_log_probs_equal_transformers(imported, lines):
    _, hf, tok, tr, _ = imported
    batch = tok(lines[0], text_target=lines[1], return_tensors="pt", padding=True)
    labels = batch["labels"]  # (B, T) target ids + EOS, right-padded with the pad id
    start = torch.full_like(labels[:, :1], hf.config.decoder_start_token_id)
    tgt_in = torch.cat([start, labels[:, :-1]], dim=1)  # MarianMT's shift_tokens_right: the decoder starts from pad
    with torch.inference_mode():
        theirs = hf(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in
        ).logits.log_softmax(-1)
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
    assert [h[0].logprob for h in ours] == pytest.approx(
        scores, abs=1e-4
    )  # at length penalty 0 both are the summed log-prob
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
    assert (model_cfg["eos_id"], model_cfg["unk_id"], model_cfg["pad_id"], model_cfg["bos_id"]) == (
        0,
        1,
        vocab["<pad>"],
        -1,
    )
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


# ---------------------------------------------------------------- crafted directories: one line, exit 2, memory bounded
# Each case changes a copy of a valid directory as a stranger could, and runs `tmt import` under the address-space cap
# of tests/hostile.py: what the files ask for must be checked before it is allocated.


def _import(directory, tmp_path):
    return run_tmt(["import", directory, "--from", "marian-hf", "-o", tmp_path / "m.pt"], suite="marian-hf crafted")


def _save_safetensors(directory, change) -> None:
    """Apply ``change`` to the tensors of ``directory``'s model.safetensors and write them back."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(directory / "model.safetensors"))
    change(weights)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _shard(directory, names) -> None:
    """model.safetensors as one shard with an index whose weight_map gives each tensor ``names(tensor)`` as its file."""
    from safetensors.torch import load_file

    weights = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    index = {"metadata": {"total_size": 0}, "weight_map": {name: names(name) for name in weights}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")


@pytest.mark.usefixtures("memory_limit")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"d_model": 1 << 20}, "d_model"),  # refused by the limits alone
        ({"encoder_layers": 100_000, "decoder_layers": 100_000}, "encoder_layers"),
        ({"max_position_embeddings": 1 << 28}, "max_position_embeddings"),
        (
            {"d_model": 8192, "encoder_ffn_dim": 1 << 20, "decoder_ffn_dim": 1 << 20},
            "d_model",
        ),  # each within its limit: the size bound
        ({"max_position_embeddings": 1 << 20, "d_model": 512}, "max_position_embeddings"),  # a 2 GiB sinusoid table
    ],
)
def test_config_sizes_are_bounded_before_anything_is_allocated(marian_dir, tmp_path, change, field):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    edit_json(bad / "config.json", change)
    assert_refused_in_one_line(_import(bad, tmp_path), names=["config.json", field])
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.usefixtures("memory_limit")
def test_config_within_the_bounds_is_checked_against_the_stored_shapes_before_the_model_is_built(marian_dir, tmp_path):
    """d_model 4096 with 2+2 layers is ~400M parameters, within the bound, but 1.6 GB that the 250 KB file does not
    hold: the stored tensors' shapes refuse it before a model of that size exists."""
    bad = copy_marian(marian_dir, tmp_path / "bad")
    edit_json(bad / "config.json", {"d_model": 4096})
    assert_refused_in_one_line(
        _import(bad, tmp_path), names=["model.safetensors", "model.shared.weight", "(536, 4096)"]
    )


@pytest.mark.usefixtures("memory_limit")
def test_zero_width_position_table_is_refused_by_its_shape(marian_dir, tmp_path):
    """120 bytes of header that claim a (5e7, 0) sinusoid table made the importer compute 5e7 sinusoids."""
    bad = copy_marian(marian_dir, tmp_path / "bad")
    _save_safetensors(bad, lambda w: w.__setitem__("model.encoder.embed_positions.weight", torch.zeros(50_000_000, 0)))
    assert_refused_in_one_line(
        _import(bad, tmp_path), names=["model.safetensors", "model.encoder.embed_positions.weight", "(128, 32)"]
    )


@pytest.mark.parametrize(
    ("file", "change", "field"),
    [
        ("generation_config.json", {"num_beams": 2000}, "num_beams"),
        ("generation_config.json", {"num_beams": "4"}, "num_beams"),
        ("config.json", {"dropout": 1.5}, "dropout"),
        ("config.json", {"attention_dropout": -0.1}, "attention_dropout"),
        ("config.json", {"dropout": "x"}, "dropout"),
        ("config.json", {"dropout": None}, "dropout"),
        ("config.json", {"activation_dropout": float("nan")}, "activation_dropout"),
        ("config.json", {"activation_function": []}, "activation_function"),
        ("config.json", {"encoder_attention_heads": 0, "decoder_attention_heads": 0}, "encoder_attention_heads"),
        ("config.json", {"share_encoder_decoder_embeddings": "no"}, "share_encoder_decoder_embeddings"),
        ("config.json", {"bos_token_id": 10**6}, "bos_token_id"),
        ("tokenizer_config.json", {"unk_token": {"content": ["<unk>"]}}, "unk_token"),
    ],
)
def test_values_every_later_command_refuses_are_refused_at_import(marian_dir, tmp_path, file, change, field):
    """Values of the wrong type, or that `tmt translate` would refuse in the checkpoint, are refused naming the file
    and the field, and no checkpoint is written."""
    bad = copy_marian(marian_dir, tmp_path / "bad")
    edit_json(bad / file, change)
    assert_refused_in_one_line(_import(bad, tmp_path), names=[file, field])
    assert not (tmp_path / "m.pt").exists()


def test_separate_vocabs_without_a_target_vocabulary_names_the_setting(marian_dir, tmp_path):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    edit_json(bad / "tokenizer_config.json", {"separate_vocabs": True})
    assert_refused_in_one_line(
        _import(bad, tmp_path), names=["tokenizer_config.json", "separate_vocabs", "target_vocab.json"]
    )


@pytest.mark.parametrize("file", ["config.json", "vocab.json", "model.safetensors.index.json"])
def test_json_nested_too_deep_is_refused(marian_dir, tmp_path, file):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    if file.endswith("index.json"):
        _shard(bad, lambda name: "model-00001-of-00001.safetensors")
    (bad / file).write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert_refused_in_one_line(_import(bad, tmp_path), names=[file])


@pytest.mark.parametrize(
    ("index", "words"),
    [
        ({"weight_map": {"model.shared.weight": 1}}, ["weight_map", "1"]),
        ({"weight_map": [1, 2]}, ["weight_map"]),
        (
            {"weight_map": {"model.shared.weight": "model-00001-of-00001.safetensors"}},
            ["model-00001-of-00001.safetensors", "weight_map"],
        ),
        ({"weight_map": {"model.shared.weight": "x" * 10_000}}, ["weight_map", "x..."]),
    ],
)
def test_weight_index_of_the_wrong_form_is_refused(marian_dir, tmp_path, index, words):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    _shard(bad, lambda name: "model-00001-of-00001.safetensors")
    (bad / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    assert_refused_in_one_line(_import(bad, tmp_path), names=["model.safetensors.index.json", *words])


@pytest.mark.usefixtures("memory_limit")
@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("model.encoder.layers.0.self_attn.k_proj.weight", torch.zeros(32, 31)),  # torch.cat of q, k and v
        ("model.encoder.layers.0.self_attn.k_proj.weight", torch.zeros(31, 32)),
        ("model.decoder.layers.1.fc1.weight", torch.zeros(64, 32, 1)),
        ("model.encoder.embed_positions.weight", torch.zeros(10, 3)),
        ("final_logits_bias", torch.zeros(2, 268)),  # as many numbers as (1, 536)
        ("model.encoder.layers.0.fc2.bias", torch.zeros(32, dtype=torch.int64)),
    ],
)
def test_a_tensor_of_the_wrong_shape_or_dtype_is_refused_naming_it(marian_dir, tmp_path, name, tensor):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    _save_safetensors(bad, lambda w: w.__setitem__(name, tensor))
    assert_refused_in_one_line(_import(bad, tmp_path), names=["model.safetensors", name])


def test_a_safetensors_header_past_its_bound_is_refused_before_it_is_parsed(marian_dir, tmp_path):
    """A header is the tensors' names, shapes and offsets, a few KB: one of 20 MB (here the valid header padded with
    spaces, which safetensors reads) is refused before the parser builds it."""
    bad = copy_marian(marian_dir, tmp_path / "bad")
    raw = (bad / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + size] + b" " * (20 << 20)
    (bad / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + size :])
    assert_refused_in_one_line(_import(bad, tmp_path), names=["model.safetensors", "header"])


def test_half_precision_weights_import_as_float32(marian_dir, tmp_path):
    bad = copy_marian(marian_dir, tmp_path / "half")
    _save_safetensors(bad, lambda w: w.update({k: v.half() for k, v in w.items()}))
    outcome = _import(bad, tmp_path)
    assert outcome.code == 0, outcome.err
    state = load_checkpoint(tmp_path / "m.pt")["model"]
    assert all(t.dtype == torch.float32 for t in state.values())


@pytest.mark.parametrize("where", ["absolute", "parent", "link-outside", "nested-parent", "directory"])
def test_shard_names_outside_the_directory_are_refused(marian_dir, tmp_path, where):
    """A weight_map may name only files of the model's own directory: not an absolute path, not `..`, not a link that
    leads out of it (a copy of the weights lies outside, so that following the name would import them)."""
    bad = copy_marian(marian_dir, tmp_path / "bad")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(bad / "model.safetensors", outside)
    names = {
        "absolute": str(outside),
        "parent": "../outside.safetensors",
        "link-outside": "model-00001-of-00001.safetensors",
        "nested-parent": "sub/../../outside.safetensors",
        "directory": ".",
    }
    _shard(bad, lambda name: names[where])
    if where == "link-outside":
        (bad / "model-00001-of-00001.safetensors").unlink()
        (bad / "model-00001-of-00001.safetensors").symlink_to(outside)
    outcome = _import(bad, tmp_path)
    assert_refused_in_one_line(outcome, names=["model.safetensors.index.json"])
    assert not (tmp_path / "m.pt").exists()


def test_a_sharded_model_imports_as_the_single_file_does(marian_dir, tmp_path):
    first = run_tmt(
        ["import", marian_dir.path, "--from", "marian-hf", "-o", tmp_path / "one.pt"], suite="marian-hf crafted"
    )
    assert first.code == 0, first.err
    sharded = copy_marian(marian_dir, tmp_path / "sharded")
    _shard(sharded, lambda name: "model-00001-of-00001.safetensors")
    assert _import(sharded, tmp_path).code == 0
    one, two = load_checkpoint(tmp_path / "one.pt")["model"], load_checkpoint(tmp_path / "m.pt")["model"]
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def test_pytorch_model_bin_is_read_weights_only_and_shape_checked(marian_dir, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(str(marian_dir.path / "model.safetensors"))
    first = run_tmt(
        ["import", marian_dir.path, "--from", "marian-hf", "-o", tmp_path / "one.pt"], suite="marian-hf crafted"
    )
    assert first.code == 0, first.err
    good = copy_marian(marian_dir, tmp_path / "bin")
    (good / "model.safetensors").unlink()
    torch.save(weights, good / "pytorch_model.bin")
    assert _import(good, tmp_path).code == 0
    one, two = load_checkpoint(tmp_path / "one.pt")["model"], load_checkpoint(tmp_path / "m.pt")["model"]
    assert all(torch.equal(one[k], two[k]) for k in one)
    torch.save({**weights, "model.shared.weight": torch.zeros(536, 33)}, good / "pytorch_model.bin")
    assert_refused_in_one_line(_import(good, tmp_path / "x"), names=["pytorch_model.bin", "model.shared.weight"])


def test_error_lines_never_repeat_a_long_value(marian_dir, tmp_path):
    bad = copy_marian(marian_dir, tmp_path / "bad")
    edit_json(bad / "config.json", {"model_type": "m" * 100_000})
    outcome = _import(bad, tmp_path)
    assert_refused_in_one_line(outcome, names=["config.json", "model_type"])
    assert "m" * 100 not in outcome.err
