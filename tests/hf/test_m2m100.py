"""NLLB / M2M100 in and out: tiny random ``M2M100ForConditionalGeneration`` models built and saved by transformers,
with an ``NllbTokenizer`` over a BPE sentencepiece model trained on a Multi30k slice and three real NLLB language
codes; tmt's numbers are compared with transformers' own forward pass and ``generate``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import head
from tests.hf.conftest import train_spm

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from transformer_mt.checkpoint import load_checkpoint  # noqa: E402
from transformer_mt.decoding import ForcedPrefix, model_from_checkpoint, search  # noqa: E402
from transformer_mt.hf import HfError  # noqa: E402
from transformer_mt.hf.m2m100_importer import import_m2m100  # noqa: E402

LANGS = ["eng_Latn", "deu_Latn", "fra_Latn"]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _save_random_m2m100(root: Path, vocab_size: int, *, seed: int, eos_scale: float) -> None:
    """A tiny random M2M100ForConditionalGeneration saved in ``root``: weights drawn wider than transformers' init
    (std 0.02 makes every logit nearly equal, so that a search's choices would rest on float rounding), the LayerNorms
    and biases perturbed so that every tensor's place is tested, and the </s> row scaled by ``eos_scale`` so that some
    outputs end before the length limit."""
    config = transformers.M2M100Config(
        vocab_size=vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        init_std=0.25,
    )
    torch.manual_seed(seed)
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                p.add_(0.2 * torch.randn_like(p))
        model.model.shared.weight[2] *= eos_scale
    model.save_pretrained(str(root))


@pytest.fixture(scope="module")
def sentences(multi30k) -> list[str]:
    return head(multi30k / "val.en", 32)


@pytest.fixture(scope="module")
def nllb_dir(multi30k, tmp_path_factory) -> Path:
    """An NLLB-shaped directory as save_pretrained writes it, plus sentencepiece.bpe.model as on the Hub. The weights
    are drawn wider than transformers' init (std 0.02 makes every logit nearly equal, so that a search's choices
    would rest on float rounding) and the LayerNorms perturbed, so that every tensor's place is tested."""
    root = tmp_path_factory.mktemp("nllb")
    lines = head(multi30k / "train.en", 1500) + head(multi30k / "train.de", 1500) + head(multi30k / "train.fr", 1500)
    (root / "sentencepiece.bpe.model").write_bytes(train_spm(lines, 400, model_type="bpe"))
    tok = transformers.NllbTokenizer.from_pretrained(str(root), additional_special_tokens=LANGS)
    tok.save_pretrained(str(root))
    _save_random_m2m100(root, len(tok), seed=0, eos_scale=2.5)
    return root


@pytest.fixture(scope="module")
def imported(nllb_dir, tmp_path_factory):
    out = import_m2m100(nllb_dir, tmp_path_factory.mktemp("tmt") / "nllb.pt")
    ckpt = load_checkpoint(out)
    return out, ckpt


def _hf(nllb_dir: Path):
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(str(nllb_dir)).eval()
    tok = transformers.NllbTokenizer.from_pretrained(str(nllb_dir))
    return model, tok


def _tmt(path: Path):
    loaded = model_from_checkpoint(path)
    return loaded.model.eval(), loaded.src_tok


def test_import_maps_the_config_and_languages(imported):
    _, ckpt = imported
    m = ckpt["config"]["model"]
    assert (m["norm"], m["position_layout"], m["position_offset"]) == ("pre", "fairseq", 2)
    assert (m["pad_id"], m["unk_id"], m["bos_id"], m["eos_id"], m["decoder_start_id"]) == (1, 3, 0, 2, 2)
    assert m["decoder_languages"].split() == LANGS


def test_tokenizer_ids_equal_nllbs(nllb_dir, imported, sentences):
    _, hf_tok = _hf(nllb_dir)
    _, tok = _tmt(imported[0])
    hf_tok.src_lang = "eng_Latn"
    lang = tok.vocab.index("eng_Latn")
    for line in sentences:
        assert [lang, *tok.encode([line])[0], 2] == hf_tok(line).input_ids


def test_teacher_forced_log_probs_match_transformers(nllb_dir, imported, sentences, multi30k):
    hf_model, hf_tok = _hf(nllb_dir)
    model, _ = _tmt(imported[0])
    targets = head(multi30k / "val.de", 32)
    hf_tok.src_lang, hf_tok.tgt_lang = "eng_Latn", "deu_Latn"
    batch = hf_tok(sentences, text_target=targets, return_tensors="pt", padding=True)
    labels = batch["labels"]  # (B, T): deu_Latn, pieces, </s>, right-padded with <pad>
    tgt_in = torch.cat([torch.full((labels.size(0), 1), 2), labels[:, :-1]], dim=1)  # </s> + labels, shifted right
    with torch.no_grad():
        theirs = hf_model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=tgt_in
        ).logits.log_softmax(-1)
        ours = model.decode(tgt_in, model.encode(batch["input_ids"])).log_softmax(-1)
    real = labels != 1
    assert real.sum() > 300
    assert (ours - theirs)[real].abs().max() < 1e-4


def test_refuses_what_does_not_map(nllb_dir, tmp_path):
    for field, value, said in (
        ("scale_embedding", False, "scale_embedding=false"),
        ("tie_word_embeddings", False, "tie_word_embeddings=false"),
        ("activation_function", "tanh", "activation_function"),
        ("normalize_before", True, "normalize_before"),
        ("decoder_attention_heads", 2, "decoder_attention_heads=2"),
    ):
        bad = tmp_path / field
        shutil.copytree(nllb_dir, bad)
        config = json.loads((bad / "config.json").read_text())
        config[field] = value
        (bad / "config.json").write_text(json.dumps(config))
        with pytest.raises(HfError) as err:
            import_m2m100(bad, tmp_path / f"{field}.pt")
        message = str(err.value)
        assert said in message and "\n" not in message and "config.json" in message


def _generate_both(nllb_dir: Path, imported, sentences: list[str], tgt: str, *, beam: int, length: int):
    """transformers' generate and tmt's search of the same sources, both with ``length`` pieces at most after the
    language code; tmt never generates <s> and <pad>, which transformers is told to suppress too."""
    hf_model, hf_tok = _hf(nllb_dir)
    model, tok = _tmt(imported[0])
    hf_tok.src_lang = "eng_Latn"
    batch = hf_tok(sentences, return_tensors="pt", padding=True)
    code = tok.vocab.index(tgt)
    with torch.no_grad():
        out = hf_model.generate(
            **batch,
            num_beams=beam,
            do_sample=False,
            length_penalty=0.0,
            forced_bos_token_id=code,
            max_new_tokens=length + 1,
            suppress_tokens=[0, 1],
            early_stopping=False,
        )
        hyps = search(
            ForcedPrefix(model, [code]), batch["input_ids"], beam=beam, lenpen=0.0, max_len_a=0, max_len_b=length
        )
    theirs = []
    for row in out.tolist():
        assert row[:2] == [2, code]
        pieces = row[2:]
        theirs.append(pieces[: pieces.index(2)] if 2 in pieces else [p for p in pieces if p != 1])
    return [h[0].tokens for h in hyps], theirs


@pytest.mark.parametrize("tgt", ["deu_Latn", "fra_Latn"])
def test_greedy_equals_generate(nllb_dir, imported, sentences, tgt):
    ours, theirs = _generate_both(nllb_dir, imported, sentences, tgt, beam=1, length=24)
    assert any(len(t) < 24 for t in theirs)  # some end with </s> before the limit
    assert ours == theirs


@pytest.mark.parametrize("tgt", ["deu_Latn", "fra_Latn"])
def test_beam4_equals_generate(nllb_dir, imported, sentences, tgt):
    ours, theirs = _generate_both(nllb_dir, imported, sentences, tgt, beam=4, length=24)
    assert any(len(t) < 24 for t in theirs)
    assert ours == theirs


def test_export_loads_in_transformers_and_round_trips(nllb_dir, imported, sentences, tmp_path):
    from transformer_mt.hf.m2m100_exporter import export_m2m100

    path, ckpt = imported
    out = export_m2m100(path, tmp_path / "exported")
    again = load_checkpoint(import_m2m100(out, tmp_path / "again.pt"))
    assert again["config"] == ckpt["config"]
    assert again["tokenizers"]["src_vocab"] == ckpt["tokenizers"]["src_vocab"]
    assert again["model"].keys() == ckpt["model"].keys()
    assert all(torch.equal(again["model"][k], ckpt["model"][k]) for k in ckpt["model"])
    original, _ = _hf(nllb_dir)
    exported, tok = _hf(out)
    tok.src_lang = "eng_Latn"
    batch = tok(sentences, return_tensors="pt", padding=True)
    _, their_tok = _hf(nllb_dir)
    their_tok.src_lang = "eng_Latn"
    assert batch["input_ids"].tolist() == their_tok(sentences, return_tensors="pt", padding=True)["input_ids"].tolist()
    start = torch.tensor([[2, tok.convert_tokens_to_ids("fra_Latn")]] * len(sentences))
    with torch.no_grad():
        a = original(**batch, decoder_input_ids=start).logits
        b = exported(**batch, decoder_input_ids=start).logits
    assert torch.equal(a, b)


def test_translator_puts_both_languages(nllb_dir, imported, sentences):
    """Translator.translate(tgt_lang=, src_lang=) of an imported NLLB model: the source code on the source, the
    target code forced after the decoder's start, the text equal to transformers' generate and batch_decode."""
    from transformer_mt.decoding import Translator
    from transformer_mt.text import LanguageError

    translator = Translator.from_checkpoint(imported[0], device="cpu")
    assert translator.languages == LANGS
    hf_model, hf_tok = _hf(nllb_dir)
    hf_tok.src_lang = "eng_Latn"
    batch = hf_tok(sentences[:8], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf_model.generate(
            **batch,
            num_beams=4,
            length_penalty=0.0,
            forced_bos_token_id=hf_tok.convert_tokens_to_ids("fra_Latn"),
            max_new_tokens=17,
            suppress_tokens=[0, 1],
        )
    theirs = hf_tok.batch_decode(out, skip_special_tokens=True)
    src_prefix, tgt_prefix = (
        translator.src_tok.tag_ids(["eng_Latn"], where="test"),
        [hf_tok.convert_tokens_to_ids("fra_Latn")],
    )
    result = translator.translate_batch(
        sentences[:8], beam=4, lenpen=0.0, max_len_a=0.0, max_len_b=16, src_prefix=src_prefix, tgt_prefix=tgt_prefix
    )
    assert [nb[0][1] for nb in result.hypotheses] == theirs
    assert translator.translate(sentences[0], beam=4, lenpen=0.0, tgt_lang="fra_Latn", src_lang="eng_Latn")
    for tgt, src in (("fra_Latn", None), ("spa_Latn", "eng_Latn")):
        with pytest.raises(LanguageError) as err:
            translator.translate(sentences[0], tgt_lang=tgt, src_lang=src)
        assert "\n" not in str(err.value) and ("src_lang" in str(err.value) or "spa_Latn" in str(err.value))


def test_marian_export_refuses_an_nllb_model(imported, tmp_path):
    from transformer_mt.hf import export_marian

    with pytest.raises(HfError, match="m2m100-hf"):
        export_marian(imported[0], tmp_path / "marian")


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("encoder_layerdrop", 1.5, "encoder_layerdrop=1.5"),
        ("vocab_size", 999, "vocab_size=999"),
        ("d_model", 30, "d_model=30"),
        ("pad_token_id", 2, "pad_token_id"),
        ("model_type", "marian", "model_type"),
    ],
)
def test_refuses_crafted_configs_in_one_line(nllb_dir, tmp_path, field, value, said):
    bad = tmp_path / "bad"
    shutil.copytree(nllb_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config[field] = value
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(HfError) as err:
        import_m2m100(bad, tmp_path / "out.pt")
    assert said in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out.pt").exists()


def test_refuses_a_tensor_of_another_shape(nllb_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(nllb_dir, bad)
    state = load_file(str(bad / "model.safetensors"))
    state["model.decoder.layers.1.fc1.weight"] = torch.zeros(65, 32)
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HfError, match=r"model\.decoder\.layers\.1\.fc1\.weight has shape \(65, 32\)"):
        import_m2m100(bad, tmp_path / "out.pt")


def test_tmt_translate_with_src_and_tgt_lang(imported, sentences, tmp_path, capsys):
    """`tmt translate --src-lang --tgt-lang` of an imported NLLB model: the Python API's translations, line for
    line; without --src-lang, one line naming it and exit code 2."""
    from tests.conftest import run_cli
    from transformer_mt.decoding import Translator

    src = tmp_path / "src.en"
    src.write_text("\n".join([*sentences[:6], "", sentences[6]]) + "\n", encoding="utf-8")
    args = ["translate", "-c", imported[0], src, "--beam", "4", "--lenpen", "0", "--device", "cpu"]
    code, out, err = run_cli([*args, "--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn"], capsys)
    assert code == 0, err
    expected = Translator.from_checkpoint(imported[0], device="cpu").translate(
        [*sentences[:6], "", sentences[6]], beam=4, lenpen=0.0, tgt_lang="deu_Latn", src_lang="eng_Latn"
    )
    assert out.split("\n")[:-1] == expected and expected[6] == ""
    code, out, err = run_cli([*args, "--tgt-lang", "deu_Latn"], capsys)
    assert code == 2 and "src_lang" in err and len(err.strip().splitlines()) == 1


def test_cli_import_and_export(nllb_dir, imported, tmp_path, capsys):
    from tests.conftest import run_cli

    code, out, err = run_cli(["import", nllb_dir, "--from", "m2m100-hf", "-o", tmp_path / "c.pt"], capsys)
    assert code == 0, err
    ckpt = load_checkpoint(tmp_path / "c.pt")
    assert all(torch.equal(ckpt["model"][k], v) for k, v in imported[1]["model"].items())
    code, out, err = run_cli(
        ["export", "-c", tmp_path / "c.pt", "--format", "m2m100-hf", "-o", tmp_path / "hf"], capsys
    )
    assert code == 0, err
    assert (tmp_path / "hf" / "model.safetensors").is_file() and "m2m100-hf" in out
    code, out, err = run_cli(["import", tmp_path / "hf", "--from", "marian-hf", "-o", tmp_path / "m.pt"], capsys)
    assert code == 2 and err.startswith("tmt: error: ") and len(err.strip().splitlines()) == 1


def test_ctranslate2_export_refuses_an_nllb_model(imported, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer_mt.export import ExportError, export

    with pytest.raises(ExportError, match="m2m100-hf"):
        export(imported[0], tmp_path / "ct2")


def test_sampling_with_both_languages_is_seeded(imported, sentences):
    from transformer_mt.decoding import Translator

    translator = Translator.from_checkpoint(imported[0], device="cpu")
    samples = translator.translate(
        sentences[:4], nbest=2, sample=True, seed=3, tgt_lang="fra_Latn", src_lang="eng_Latn"
    )
    again = translator.translate(sentences[:4], nbest=2, sample=True, seed=3, tgt_lang="fra_Latn", src_lang="eng_Latn")
    assert samples == again and all(len(nb) == 2 for nb in samples)


@pytest.fixture(scope="module")
def m2m100_dir(nllb_dir, tmp_path_factory) -> Path:
    """An M2M100-shaped directory: M2M100Tokenizer's vocab.json (fairseq's four specials, then the sentencepiece
    pieces), its 100 language tokens __xx__ and 8 made-up words after it, and a random model of that size."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("m2m100")
    shutil.copy(nllb_dir / "sentencepiece.bpe.model", root / "sentencepiece.bpe.model")
    sp = spm.SentencePieceProcessor(model_file=str(root / "sentencepiece.bpe.model"))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({sp.id_to_piece(i): 1 + i for i in range(3, sp.get_piece_size())})
    (root / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tok = transformers.M2M100Tokenizer(
        vocab_file=str(root / "vocab.json"), spm_file=str(root / "sentencepiece.bpe.model")
    )
    tok.save_pretrained(str(root))
    _save_random_m2m100(root, len(vocab) + 100 + 8, seed=1, eos_scale=4.0)
    return root


@pytest.mark.parametrize("beam", [1, 4])
def test_m2m100_tokenizer_and_search_match(m2m100_dir, sentences, tmp_path, beam):
    """An M2M100Tokenizer directory (vocab.json, __fr__): the source ids are M2M100Tokenizer's, and greedy / beam 4
    into __fr__ equal generate's."""
    path = import_m2m100(m2m100_dir, tmp_path / "m2m.pt")
    model, tok = _tmt(path)
    hf_model = transformers.M2M100ForConditionalGeneration.from_pretrained(str(m2m100_dir)).eval()
    hf_tok = transformers.M2M100Tokenizer.from_pretrained(str(m2m100_dir))
    hf_tok.src_lang = "en"
    batch = hf_tok(sentences, return_tensors="pt", padding=True)
    en, fr = tok.tag_ids(["__en__", "__fr__"], where="test")
    assert fr == hf_tok.get_lang_id("fr")
    for row, line in zip(batch["input_ids"].tolist(), sentences):
        assert [i for i in row if i != 1] == [en, *tok.encode([line])[0], 2]
    with torch.no_grad():
        out = hf_model.generate(
            **batch,
            num_beams=beam,
            length_penalty=0.0,
            forced_bos_token_id=fr,
            max_new_tokens=21,
            suppress_tokens=[0, 1],
        )
        hyps = search(ForcedPrefix(model, [fr]), batch["input_ids"], beam=beam, lenpen=0.0, max_len_a=0, max_len_b=20)
    theirs = [row[2:][: row[2:].index(2)] if 2 in row[2:] else [p for p in row[2:] if p != 1] for row in out.tolist()]
    assert any(len(t) < 20 for t in theirs)
    assert [h[0].tokens for h in hyps] == theirs


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda t: t["added_tokens"].append({"id": 5, "content": "zzz"}), "has id 5"),
        (lambda t: t["model"].__setitem__("vocab", []), "model.vocab must be an object"),
    ],
)
def test_refuses_a_damaged_tokenizer_json(nllb_dir, tmp_path, edit, said):
    bad = tmp_path / "bad"
    shutil.copytree(nllb_dir, bad)
    table = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    edit(table)
    (bad / "tokenizer.json").write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(HfError) as err:
        import_m2m100(bad, tmp_path / "out.pt")
    assert said in str(err.value) and "tokenizer.json" in str(err.value) and "\n" not in str(err.value)


def test_m2m100_tokenizer_round_trip(m2m100_dir, sentences, tmp_path):
    """An M2M100Tokenizer model exported back: M2M100Tokenizer gives the same ids, the model the same logits, and
    re-importing gives the same checkpoint."""
    from transformer_mt.hf.m2m100_exporter import export_m2m100

    first = import_m2m100(m2m100_dir, tmp_path / "a.pt")
    out = export_m2m100(first, tmp_path / "exported")
    a, b = load_checkpoint(first), load_checkpoint(import_m2m100(out, tmp_path / "b.pt"))
    assert a["config"] == b["config"] and a["tokenizers"]["src_vocab"] == b["tokenizers"]["src_vocab"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    toks = [transformers.M2M100Tokenizer.from_pretrained(str(d)) for d in (m2m100_dir, out)]
    for tok in toks:
        tok.src_lang = "de"
    assert toks[0](sentences).input_ids == toks[1](sentences).input_ids
    assert toks[1].get_lang_id("fr") == toks[0].get_lang_id("fr")
    models = [transformers.M2M100ForConditionalGeneration.from_pretrained(str(d)).eval() for d in (m2m100_dir, out)]
    batch = toks[0](sentences, return_tensors="pt", padding=True)
    start = torch.tensor([[2, toks[0].get_lang_id("fr")]] * len(sentences))
    with torch.no_grad():
        assert torch.equal(*(m(**batch, decoder_input_ids=start).logits for m in models))


def _fine_tune_yaml(tmp_path: Path, multi30k: Path, out: Path, **train) -> Path:
    """A fine-tuning config for the imported model: English -> German and English -> French, 200 Multi30k pairs
    each under NLLB's codes, one validation set per direction."""
    files = {}
    for split, n in (("train", 200), ("val", 16)):
        for lang in ("en", "de", "fr"):
            files[f"{split}.{lang}"] = tmp_path / f"{split}.{lang}"
            if not files[f"{split}.{lang}"].exists():
                files[f"{split}.{lang}"].write_text("\n".join(head(multi30k / f"{split}.{lang}", n)) + "\n")
    pairs = [("de", "deu_Latn"), ("fr", "fra_Latn")]
    cfg = {
        "data": {
            "corpora": [
                {
                    "name": f"en-{t}",
                    "src": str(files["train.en"]),
                    "tgt": str(files[f"train.{t}"]),
                    "src_lang": "eng_Latn",
                    "tgt_lang": code,
                }
                for t, code in pairs
            ],
            "valid": [
                {
                    "name": f"en-{t}",
                    "src": str(files["val.en"]),
                    "tgt": str(files[f"val.{t}"]),
                    "src_lang": "eng_Latn",
                    "tgt_lang": code,
                }
                for t, code in pairs
            ],
            "max_len": 120,  # the tiny model's 128 positions
        },
        "train": {
            "out_dir": str(out),
            "device": "cpu",
            "threads": 1,
            "lr_schedule": "inverse_sqrt",
            "warmup_updates": 1,
            "lr": 0.003,
            "max_tokens": 1500,
            "max_updates": 6,
            "validate_every": 3,
            "save_every": 3,
            "valid_bleu_sentences": 8,
            "valid_beam": 1,
            "best_metric": "loss",
            "log_every": 1,
            "keep_last": 2,
            "seed": 5,
            **train,
        },
        "model": {"dropout": 0.0},
    }
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # JSON is YAML
    return path


def test_fine_tuning_pairs_are_nllbs_own(nllb_dir, imported, multi30k, tmp_path):
    """An imported NLLB model's training pairs as NllbTokenizer makes them for fine-tuning (``text_target``): the
    source [eng_Latn, pieces] + </s>, the labels [deu_Latn, pieces, </s>]; and tmt's teacher-forced loss of a
    collated batch equals transformers' loss with those labels."""
    from transformer_mt.data import collate, load_datasets
    from transformer_mt.model import TeacherForcedLoss
    from transformer_mt.training import train_config_from_cli

    cfg = train_config_from_cli(
        config=_fine_tune_yaml(tmp_path, multi30k, tmp_path / "run"),
        overrides=[],
        resume=None,
        overwrite=False,
        init_from=imported[0],
    )
    model, tok = _tmt(imported[0])
    sets = load_datasets(cfg, tok, tok, quiet=True)
    hf_model, hf_tok = _hf(nllb_dir)
    hf_tok.src_lang, hf_tok.tgt_lang = "eng_Latn", "deu_Latn"
    en, de = head(tmp_path / "train.en", 40), head(tmp_path / "train.de", 40)
    german = sets.train[0].data
    assert german.num_pairs == 200
    rows = list(range(40))
    for i in rows:
        src, tgt = (ids.tolist() for ids in german.pair(i))
        theirs = hf_tok(en[german.line_numbers[i]], text_target=de[german.line_numbers[i]])
        assert src + [2] == theirs["input_ids"] and tgt + [2] == theirs["labels"]
    assert [v.tgt_prefix for v in sets.valid] == [[tok.vocab.index("deu_Latn")], [tok.vocab.index("fra_Latn")]]

    batch = collate([german.pair(i) for i in rows], specials=german.specials)
    with torch.no_grad():
        loss_sum, nll_sum, n_tokens = TeacherForcedLoss(model, label_smoothing=0.0)(
            batch.src, batch.tgt_in, batch.tgt_out
        )
        lines = [int(german.line_numbers[i]) for i in rows]
        enc = hf_tok([en[i] for i in lines], text_target=[de[i] for i in lines], return_tensors="pt", padding=True)
        labels = enc["labels"].masked_fill(enc["labels"] == 1, -100)
        theirs = hf_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).loss
    assert int(n_tokens) == int((labels != -100).sum())
    assert abs(float(nll_sum) / int(n_tokens) - float(theirs)) < 1e-4


@pytest.mark.slow
def test_lora_fine_tuning_of_an_imported_nllb_model(imported, multi30k, tmp_path, capsys):
    """`tmt train --init-from` an imported NLLB model with LoRA on two new directions: the validation loss of each
    falls, validation BLEU decodes with the target's code forced (equal to Translator.translate's), a resumed run
    gives the uninterrupted run's losses and weights bit for bit, and the result translates with its codes."""
    import sacrebleu

    import transformer_mt
    from transformer_mt.training import train, train_config_from_cli

    lora = {"lora": {"rank": 4, "alpha": 8, "targets": "q,k,v,o,ffn1,ffn2"}}

    def run(out: Path, **extra) -> None:
        config = _fine_tune_yaml(tmp_path, multi30k, out, **{**lora, **extra})
        train(train_config_from_cli(config=config, overrides=[], resume=None, overwrite=False, init_from=imported[0]))

    def rows(out: Path, kind: str) -> list[dict]:
        lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    whole = tmp_path / "whole"
    run(whole)
    valid = rows(whole, "valid")
    assert [r["update"] for r in valid] == [3, 6]
    for name in ("en-de", "en-fr"):
        assert valid[1][f"valid/{name}/loss"] < valid[0][f"valid/{name}/loss"], valid

    # validation BLEU of en-fr at update 6 is what the Translator gives checkpoint_last.pt's weights
    translator = transformer_mt.load(whole / "checkpoint_last.pt", device="cpu")
    lines = head(tmp_path / "val.en", 8)
    hyps = [
        h for h in translator.translate(lines, beam=1, src_lang="eng_Latn", tgt_lang="fra_Latn") if isinstance(h, str)
    ]
    assert len(hyps) == len(lines)
    bleu = sacrebleu.corpus_bleu(hyps, [head(tmp_path / "val.fr", 8)]).score
    assert abs(bleu - valid[1]["valid/en-fr/bleu"]) < 1e-9

    split = tmp_path / "split"
    run(split, max_updates=3)
    train(
        train_config_from_cli(config=None, overrides=["train.max_updates=6"], resume=split, overwrite=False),
        resume=True,
    )
    assert [r["loss"] for r in rows(split, "train")] == [r["loss"] for r in rows(whole, "train")]
    a, b = (load_checkpoint(d / "checkpoint_last.pt")["model"] for d in (whole, split))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "edit, said",
    [
        ({"train_src": "a.en", "train_tgt": "a.de", "corpora": []}, "data.train_src: an NLLB / M2M100 model"),
        (
            {"corpora": [{"name": "x", "src": "a.en", "tgt": "a.de", "tgt_lang": "deu_Latn"}]},
            "data.corpora[0].src_lang: is empty",
        ),
        (
            {"corpora": [{"name": "x", "src": "a.en", "tgt": "a.de", "src_lang": "eng_Latn", "tgt_lang": "spa_Latn"}]},
            "data.corpora[0].tgt_lang: 'spa_Latn' is not one of the model's language codes",
        ),
        (
            {"valid": [{"name": "v", "src": "a.en", "tgt": "a.de", "src_lang": "eng_Latn"}]},
            "data.valid[0].tgt_lang: is empty",
        ),
    ],
)
def test_fine_tuning_data_without_codes_is_refused(imported, tmp_path, edit, said):
    """An imported NLLB model's fine-tuning data must name both languages of every pair by the model's codes: one
    line naming the key otherwise."""
    import dataclasses

    from transformer_mt.config import ConfigError, CorpusConfig, ValidSetConfig, from_dict, validate

    cfg = from_dict(imported[1]["config"])
    validate(cfg, check_files=False)  # the imported checkpoint itself is fine
    good = CorpusConfig(name="x", src="a.en", tgt="a.de", src_lang="eng_Latn", tgt_lang="deu_Latn")
    scratch = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, corpora=[good]))
    with pytest.raises(ConfigError, match=r"model\.decoder_languages: .* fine-tune it with --init-from$"):
        validate(scratch, check_files=False)  # not from the imported model: its codes are in no tokenizer
    cfg.train = dataclasses.replace(cfg.train, init_from="nllb.pt")
    good = CorpusConfig(name="x", src="a.en", tgt="a.de", src_lang="eng_Latn", tgt_lang="deu_Latn")
    changes = {"corpora": [good], **edit}
    changes["corpora"] = [c if isinstance(c, CorpusConfig) else CorpusConfig(**c) for c in changes["corpora"]]
    if "valid" in changes:
        changes["valid"] = [ValidSetConfig(**v) for v in changes["valid"]]
    cfg.data = dataclasses.replace(cfg.data, **changes)
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_files=False)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_evaluate_serve_and_explore_with_both_languages(imported, sentences, tmp_path, capsys):
    """An imported NLLB model through `tmt evaluate --src-lang --tgt-lang` (the Python API's translations written),
    `tmt serve` (a request's src_lang and tgt_lang; requests of two target languages each get theirs; a missing or
    unknown code is one line of 422 JSON and the server keeps serving), and `tmt explore` (refused in one line)."""
    import threading

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from tests.conftest import run_cli
    from tests.serve.conftest import serving
    from transformer_mt.decoding import Translator
    from transformer_mt.explore import ExploreError, load_explorer
    from transformer_mt.serve import ServeOptions

    translator = Translator.from_checkpoint(imported[0], device="cpu")
    lines = sentences[:6]
    want = {t: translator.translate(lines, beam=2, src_lang="eng_Latn", tgt_lang=t) for t in ("deu_Latn", "fra_Latn")}
    assert want["deu_Latn"] != want["fra_Latn"]

    src, ref, hyp = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "hyp.de"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(want["fra_Latn"]) + "\n", encoding="utf-8")
    args = ["evaluate", "-c", imported[0], "--src", src, "--ref", ref, "-o", hyp, "--beam", "2", "--device", "cpu"]
    code, _, err = run_cli([*args, "--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn", "--json"], capsys)
    assert code == 0, err
    assert hyp.read_text(encoding="utf-8").splitlines() == want["deu_Latn"]
    code, _, err = run_cli([*args, "--tgt-lang", "deu_Latn"], capsys)
    assert code == 2 and "src_lang" in err and len(err.strip().splitlines()) == 1

    with serving(translator, ServeOptions(batch_wait_ms=200)) as (url, served):
        model = httpx.get(f"{url}/models").json()["models"][0]
        assert model["languages"] == LANGS and model["src_lang"] is True
        got: dict[str, list[str]] = {}

        def ask(tgt: str) -> None:
            body = {"text": lines, "src_lang": "eng_Latn", "tgt_lang": tgt, "beam": 2}
            r = httpx.post(f"{url}/translate", json=body, timeout=60)
            assert r.status_code == 200, r.text
            got[tgt] = r.json()["translations"]

        threads = [threading.Thread(target=ask, args=(t,)) for t in want]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        for body, said in (
            ({"text": "A man.", "tgt_lang": "deu_Latn"}, "give src_lang"),
            ({"text": "A man.", "src_lang": "eng_Latn", "tgt_lang": "spa_Latn"}, "'spa_Latn' is not one of"),
        ):
            r = httpx.post(f"{url}/translate", json=body, timeout=60)
            assert r.status_code == 422 and said in r.json()["error"] and "\n" not in r.json()["error"]
        r = httpx.post(
            f"{url}/translate", json={"text": lines, "src_lang": "eng_Latn", "tgt_lang": "fra_Latn", "beam": 2}
        )
        assert r.status_code == 200 and r.json()["translations"] == want["fra_Latn"]

    with pytest.raises(ExploreError) as refused:
        load_explorer([str(imported[0])])
    assert "NLLB" in str(refused.value) and "\n" not in str(refused.value)


def _nllb200_order(nllb_dir: Path, out: Path) -> int:
    """A copy of ``nllb_dir`` whose tokenizer files put the language codes before <mask>, as NLLB-200's own do (the
    fixture's, converted by transformers, put <mask> first); returns the first code's id."""
    shutil.copytree(nllb_dir, out)
    table = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in table["added_tokens"]}
    mask = ids["<mask>"]
    assert [ids[c] for c in LANGS] == [mask + 1, mask + 2, mask + 3]
    moved = {mask: mask + 3, **{mask + 1 + i: mask + i for i in range(3)}}

    def move(i: int) -> int:
        return moved.get(i, i)

    table["model"]["vocab"] = {piece: move(i) for piece, i in table["model"]["vocab"].items()}
    for token in table["added_tokens"]:
        token["id"] = move(token["id"])
    for special in ((table.get("post_processor") or {}).get("special_tokens") or {}).values():
        special["ids"] = [move(i) for i in special["ids"]]
    (out / "tokenizer.json").write_text(json.dumps(table), encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    if "added_tokens_decoder" in config:
        config["added_tokens_decoder"] = {str(move(int(k))): v for k, v in config["added_tokens_decoder"].items()}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return mask


def test_nllb200_id_order_exports_with_its_own_ids(nllb_dir, sentences, tmp_path):
    """NLLB-200's tokenizer holds the language codes before <mask>: such a model imports, exports with a
    tokenizer.json that gives NllbTokenizer the same ids (sentences, codes, <mask>), the exported model computes the
    original's logits, and importing the export again gives the same checkpoint."""
    from transformer_mt.hf.m2m100_exporter import export_m2m100

    first = _nllb200_order(nllb_dir, tmp_path / "nllb200")
    original = transformers.NllbTokenizer.from_pretrained(str(tmp_path / "nllb200"))
    specials = [*LANGS, "<mask>"]
    assert original.convert_tokens_to_ids(specials) == [first, first + 1, first + 2, first + 3]
    ckpt = import_m2m100(tmp_path / "nllb200", tmp_path / "a.pt")
    out = export_m2m100(ckpt, tmp_path / "exported")
    assert (out / "tokenizer.json").is_file()
    exported = transformers.NllbTokenizer.from_pretrained(str(out))
    assert exported.convert_tokens_to_ids(specials) == original.convert_tokens_to_ids(specials)
    for tok in (original, exported):
        tok.src_lang, tok.tgt_lang = "fra_Latn", "deu_Latn"
    targets = sentences[::-1]
    assert exported(sentences, text_target=targets).input_ids == original(sentences, text_target=targets).input_ids
    assert exported(sentences, text_target=targets)["labels"] == original(sentences, text_target=targets)["labels"]
    batch = original(sentences, return_tensors="pt", padding=True)
    start = torch.tensor([[2, first + 1]] * len(sentences))  # </s> deu_Latn
    models = [
        transformers.M2M100ForConditionalGeneration.from_pretrained(str(d)).eval() for d in (tmp_path / "nllb200", out)
    ]
    with torch.no_grad():
        assert torch.equal(*(m(**batch, decoder_input_ids=start).logits for m in models))
    a, b = load_checkpoint(ckpt), load_checkpoint(import_m2m100(out, tmp_path / "b.pt"))
    assert a["config"] == b["config"] and a["tokenizers"]["src_vocab"] == b["tokenizers"]["src_vocab"]
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_inspect_names_an_nllb_models_codes(imported, capsys):
    from tests.conftest import run_cli

    code, out, err = run_cli(["inspect", imported[0]], capsys)
    assert code == 0, err
    assert f"languages: {', '.join(LANGS)} (NLLB / M2M100: --src-lang and --tgt-lang pick two" in out
    assert "<2" not in out


def test_an_ensemble_of_nllb_models_forces_the_code(imported, sentences):
    """Two copies of an imported NLLB model decode as an ensemble with both codes put on: the single model's
    translations, greedy and beam 4 (the members' mean of equal probabilities is each one's)."""
    from transformer_mt.decoding import Translator

    one = Translator.from_checkpoint(imported[0], device="cpu")
    two = Translator.from_checkpoints([imported[0], imported[0]], device="cpu")
    for beam in (1, 4):
        for tgt in ("deu_Latn", "fra_Latn"):
            want = one.translate(sentences[:8], beam=beam, lenpen=0.0, src_lang="eng_Latn", tgt_lang=tgt)
            assert two.translate(sentences[:8], beam=beam, lenpen=0.0, src_lang="eng_Latn", tgt_lang=tgt) == want
