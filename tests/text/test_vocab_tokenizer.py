"""A tokenizer whose ids come from a vocabulary file (MarianMT's vocab.json): sentencepiece only segments."""

from __future__ import annotations

import pytest
import sentencepiece as spm

from tests.conftest import head
from transformer_mt.checkpoint import CheckpointError, pack_tokenizer_pair, tokenizers_from_checkpoint
from transformer_mt.config import Config
from transformer_mt.text import SpecialIds, Tokenizer, TokenizerError


def _marian_vocab(spm_model) -> list[str]:
    """MarianMT's order: "</s>" 0, "<unk>" 1, then the pieces (sentencepiece's specials left out), "<pad>" last."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    return ["</s>", "<unk>", *pieces, "<pad>"]


def _marian_ids(vocab: list[str]) -> SpecialIds:
    return SpecialIds(pad=len(vocab) - 1, unk=1, bos=-1, eos=0, start=len(vocab) - 1)


def test_ids_are_the_vocabulary_index_of_each_piece(spm_model, multi30k):
    vocab = _marian_vocab(spm_model)
    tok = Tokenizer(spm_model, vocab=vocab, specials=_marian_ids(vocab))
    plain = Tokenizer(spm_model)
    lines = head(multi30k / "val.en", 32)
    for line, ids, pieces in zip(lines, tok.encode(lines), plain.encode_pieces(lines)):
        assert [vocab[i] for i in ids] == pieces  # the same segmentation, other ids
        assert tok.decode([ids])[0] == plain.decode(plain.encode([line]))[0]
    assert tok.vocab_size == len(vocab) and tok.pieces() == vocab and tok.id_to_piece(0) == "</s>"


def test_a_piece_outside_the_vocabulary_is_unk_and_specials_are_not_text(spm_model):
    vocab = _marian_vocab(spm_model)
    dropped = Tokenizer(spm_model).encode_pieces(["A dog."])[0][-1]  # "." or "▁."
    smaller = [p for p in vocab if p != dropped]
    tok = Tokenizer(spm_model, vocab=smaller, specials=_marian_ids(smaller))
    ids = tok.encode(["A dog."])[0]
    assert ids[-1] == 1  # unk
    eos, pad = 0, len(smaller) - 1
    assert tok.decode([[pad, *ids[:-1], eos, pad]]) == tok.decode([ids[:-1]])


def test_a_leading_language_tag_is_one_piece(spm_model):
    vocab = _marian_vocab(spm_model) + [">>deu<<"]
    vocab[-2], vocab[-1] = vocab[-1], vocab[-2]  # "<pad>" stays last
    tok = Tokenizer(spm_model, vocab=vocab, specials=_marian_ids(vocab))
    tagged, plain = tok.encode([">>deu<< A dog.", "A dog."])
    assert tagged[0] == vocab.index(">>deu<<")
    assert tagged[1:] == Tokenizer(spm_model, vocab=vocab, specials=_marian_ids(vocab)).encode([" A dog."])[0]
    assert plain[0] != tagged[0]


def test_bad_vocabularies_are_refused_in_one_line(spm_model):
    vocab = _marian_vocab(spm_model)
    with pytest.raises(TokenizerError, match="lists a piece twice"):
        Tokenizer(spm_model, vocab=[*vocab, vocab[5]], specials=_marian_ids(vocab))
    with pytest.raises(TokenizerError, match="outside its vocabulary"):
        Tokenizer(spm_model, vocab=vocab[:10], specials=_marian_ids(vocab))


def test_the_checkpoint_keeps_the_vocabularies(spm_model):
    vocab = _marian_vocab(spm_model)
    cfg = Config()
    cfg.model.pad_id, cfg.model.eos_id, cfg.model.bos_id, cfg.model.decoder_start_id = (
        len(vocab) - 1,
        0,
        -1,
        len(vocab) - 1,
    )
    src = Tokenizer(spm_model, vocab=vocab, specials=_marian_ids(vocab))
    state = {"tokenizers": pack_tokenizer_pair(src, src)}
    back_src, back_tgt = tokenizers_from_checkpoint(state, cfg)
    assert back_src == src and back_tgt is back_src  # a joint vocabulary is one tokenizer
    assert back_src.encode(["Two men."]) == src.encode(["Two men."])
    state["tokenizers"]["tgt_vocab"] = vocab[:-1]  # the config's pad id is now outside the target vocabulary
    with pytest.raises(CheckpointError, match="tgt tokenizer"):
        tokenizers_from_checkpoint(state, cfg, source="x.pt")
    state["tokenizers"]["tgt_vocab"] = "not a list"
    with pytest.raises(CheckpointError, match="'tgt_vocab' is not a list"):
        tokenizers_from_checkpoint(state, cfg, source="x.pt")
    assert Tokenizer(spm_model).fingerprint != src.fingerprint  # corpus caches keyed on it are not shared
