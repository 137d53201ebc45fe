"""model.restrict_output: the output layer scores only the target pieces of the training data (and the special ids).
Expectations from the full model with the same weights, from the tokenized target file, and from a greedy search
written out here over the full model's masked scores."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_VOCAB, head, run_config, tiny_model, tokens
from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import ConfigError
from transformer_mt.data import source_tensor
from transformer_mt.decoding import greedy_search, search
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

V = TINY_VOCAB
KEPT = torch.tensor([5, 6, 9, 12, 13, 20, 21, 22, 30, 31, 38])  # a target side that uses 11 of the 36 pieces
pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(norm: str = "pre"):
    """The same random weights twice: a full model and a restricted one (kept: the special ids and KEPT)."""
    full, restricted = tiny_model(norm=norm), tiny_model(norm=norm, restrict_output=True)
    restricted.load_state_dict(full.state_dict(), strict=False)  # all but output_ids, which the full model lacks
    restricted.restrict_output_to(KEPT.flip(0).repeat(2))  # repeats and any order: a set
    return full, restricted


@pytest.mark.parametrize("norm", ["pre", "scale"])
def test_restricted_logits_equal_the_full_ones_on_the_kept_pieces(norm):
    full, restricted = _pair(norm)
    kept = torch.tensor([PAD_ID, UNK_ID, BOS_ID, EOS_ID, *KEPT.tolist()])
    assert torch.equal(restricted.output_ids, kept) and restricted.output_size == 15
    dropped = torch.ones(V, dtype=torch.bool).index_fill_(0, kept, False)
    src, tgt = tokens([6, 3, 5], seed=11), tokens([5, 7, 2], bos=True, seed=12)
    with torch.no_grad():
        want, got = full(src, tgt), restricted(src, tgt)  # (B, T, V) each
    torch.testing.assert_close(got[..., kept], want[..., kept], rtol=0, atol=1e-5)
    assert got[..., dropped].eq(float("-inf")).all()
    cache_full, cache_restricted = full.init_cache(full.encode(src)), restricted.init_cache(restricted.encode(src))
    for step in range(3):  # incremental decoding: the same, step by step
        want, got = full.decode_step(tgt[:, step], cache_full), restricted.decode_step(tgt[:, step], cache_restricted)
        torch.testing.assert_close(got[:, kept], want[:, kept], rtol=0, atol=1e-5)
        assert got[:, dropped].eq(float("-inf")).all()


def test_training_loss_is_label_smoothing_over_the_kept_pieces():
    full, restricted = _pair()
    kept = restricted.output_ids
    src, tgt_in = tokens([6, 3], seed=3), tokens([4, 3], bos=True, seed=4)
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((2, 1), PAD_ID)], dim=1)
    tgt_out[0, 3], tgt_out[1, 2] = EOS_ID, EOS_ID
    tgt_out[tgt_out.gt(EOS_ID)] = KEPT[tgt_out[tgt_out.gt(EOS_ID)] % len(KEPT)]  # targets among the kept pieces
    eps, k = 0.1, kept.numel()
    loss, nll, n = TeacherForcedLoss(restricted, label_smoothing=eps)(src, tgt_in, tgt_out)
    # by hand from the full model's logits: a softmax over the K kept pieces, 1 - eps on the reference, eps / (K - 1)
    # on the others
    logp = torch.log_softmax(full(src, tgt_in)[..., kept].double(), dim=-1)[tgt_out.ne(PAD_ID)]  # (N, K)
    ref = torch.searchsorted(kept, tgt_out[tgt_out.ne(PAD_ID)])  # (N,) kept index of each target
    want_nll = -logp[torch.arange(len(ref)), ref]
    want = (1 - eps - eps / (k - 1)) * want_nll - eps / (k - 1) * logp.sum(-1)
    assert (
        n == 7
        and nll.item() == pytest.approx(want_nll.sum().item(), rel=1e-5)
        and loss.item() == pytest.approx(want.sum().item(), rel=1e-5)
    )
    # a target piece outside the kept set (e.g. in a validation set) is scored as UNK, not as an infinite loss
    outside = tgt_out.clone()
    outside[0, 0] = 7  # not kept
    as_unk = tgt_out.clone()
    as_unk[0, 0] = UNK_ID
    criterion = TeacherForcedLoss(restricted, label_smoothing=eps)
    assert criterion(src, tgt_in, outside)[0].item() == pytest.approx(
        criterion(src, tgt_in, as_unk)[0].item(), rel=1e-6
    )


def test_restrict_output_to_needs_the_option():
    with pytest.raises(ValueError, match="model.restrict_output: true"):
        tiny_model().restrict_output_to(KEPT)


@pytest.fixture(scope="module")
def restricted_run(corpus_slice, spm_model, tmp_path_factory):
    """A tiny restricted model trained 40 updates on the corpus slice through `train()`; per-update loss per token."""
    from transformer_mt.training import train

    out = tmp_path_factory.mktemp("restricted_run") / "run"
    cfg = run_config(corpus_slice, spm_model, out, *_RUN)
    losses = []
    result = train(cfg, on_update=lambda update, stats: losses.append(stats.loss / stats.tokens))
    assert result.progress.update == 40, result.stop_reason
    return out, losses, cfg


_RUN = [
    "model.restrict_output=true",
    "model.norm=pre",
    "model.encoder_layers=2",
    "model.decoder_layers=2",
    "model.d_model=32",
    "model.heads=4",
    "model.d_ff=64",
    "model.dropout=0.0",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.005",
    "train.warmup_updates=10",
    "train.max_tokens=2000",
    "train.max_updates=40",
    "train.validate_every=40",
    "train.valid_bleu_sentences=4",
    "train.threads=1",
    "train.seed=3",
]


def test_kept_set_is_the_pieces_of_the_tokenized_target_file(restricted_run, corpus_slice, spm_model):
    out, losses, _ = restricted_run
    tok = Tokenizer(spm_model)
    expected = {i for ids in tok.encode(head(corpus_slice["train.de"], 2000)) for i in ids} | {
        PAD_ID,
        UNK_ID,
        BOS_ID,
        EOS_ID,
    }
    state = load_checkpoint(out / "checkpoint_last.pt")
    kept = state["model"]["output_ids"]
    assert kept.tolist() == sorted(expected)
    assert 0.3 * tok.vocab_size < len(expected) < 0.95 * tok.vocab_size  # a real restriction of the joint vocabulary
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert all(math.isfinite(x) for x in losses) and last < first - 1.0, (first, last)
    assert "output layer: " in (out / "train.log").read_text(encoding="utf-8")


def test_greedy_equals_the_full_model_masked_to_the_kept_pieces(restricted_run, corpus_slice):
    """tmt's greedy search (KV cache) on the restricted model == a greedy loop written here over the full model (no
    restriction, same weights, full forward per step) whose scores for the pieces not kept are set to -inf."""
    out, _, cfg = restricted_run
    state = load_checkpoint(out / "checkpoint_last.pt")["model"]
    v = state["src_embed.weight"].size(0)
    restricted = Transformer(cfg.model, src_vocab_size=v, tgt_vocab_size=v).eval()
    restricted.load_state_dict(state)  # the kept set comes from the checkpoint, at its size
    assert restricted.output_ids is not None and torch.equal(restricted.output_ids, state["output_ids"])
    full = Transformer(dataclasses.replace(cfg.model, restrict_output=False), src_vocab_size=v, tgt_vocab_size=v).eval()
    full.load_state_dict({k: t for k, t in state.items() if k != "output_ids"})
    masked = torch.full((v,), float("-inf")).index_fill_(0, state["output_ids"], 0.0)  # 0 on kept pieces
    masked[PAD_ID] = masked[BOS_ID] = float("-inf")  # never generated (search's rule)
    tok = Tokenizer(cfg.tokenizer.model)
    for line in head(corpus_slice["val.en"], 6):
        src = source_tensor(tok.encode([line]))
        got = greedy_search(restricted, src, max_len_a=0.0, max_len_b=20)[0].tokens
        ys = [BOS_ID]
        with torch.no_grad():
            for _ in range(20):
                nxt = int((full(src, torch.tensor([ys]))[0, -1] + masked).argmax())
                if nxt == EOS_ID:
                    break
                ys.append(nxt)
        assert got == ys[1:], line
        assert set(got) <= set(state["output_ids"].tolist())


def test_resume_keeps_the_saved_kept_set(restricted_run, corpus_slice, spm_model, tmp_path):
    """A resumed run takes the checkpoint's kept set, not one recomputed from (here, smaller) training data."""
    import shutil

    from transformer_mt.training import train

    out, _, _ = restricted_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    small = {name: tmp_path / name for name in ("train.en", "train.de")}
    for name, path in small.items():
        path.write_text("\n".join(head(corpus_slice[name], 50)) + "\n", encoding="utf-8")
    cfg = run_config(
        {**corpus_slice, **small}, spm_model, run, *_RUN, "train.max_updates=42", "train.validate_every=100"
    )
    assert train(cfg, resume=True).progress.update == 42
    assert torch.equal(
        load_checkpoint(run / "checkpoint_last.pt")["model"]["output_ids"],
        load_checkpoint(out / "checkpoint_last.pt")["model"]["output_ids"],
    )


def test_subword_sampling_is_refused(corpus_slice, spm_model, tmp_path):
    from transformer_mt.training import train

    cfg = run_config(corpus_slice, spm_model, tmp_path / "run", *_RUN, "data.subword_alpha=0.3")
    with pytest.raises(ConfigError, match="data.subword_alpha=0.3"):
        train(cfg)


def test_ctranslate2_export_gives_the_same_greedy_output(restricted_run, corpus_slice, tmp_path):
    """The export writes the full output layer with a -1e9 bias on the pieces not kept: CTranslate2's greedy output
    equals tmt's on the restricted model."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformer_mt.decoding import Translator, translate_ids
    from transformer_mt.export import export

    out, _, _ = restricted_run
    ct2_dir = export(out / "checkpoint_last.pt", tmp_path / "ct2")
    tr = Translator.from_checkpoint(out / "checkpoint_last.pt", device="cpu")
    lines = head(corpus_slice["val.en"], 12)
    ours = [
        nb[0].tokens
        for nb in translate_ids(tr.model, tr.src_tok.encode(lines), beam=1, lenpen=0.0, max_len_a=0.0, max_len_b=20)
    ]
    ct = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    theirs = ct.translate_batch(tr.src_tok.encode_pieces(lines), beam_size=1, max_decoding_length=20)
    assert [tr.tgt_tok.sp.piece_to_id(r.hypotheses[0]) for r in theirs] == ours


class FullVocabulary(torch.nn.Module):
    """A model as a search sees it when its cache cannot restrict the logits (no ``restrict_logits``): every step
    scores the whole vocabulary, -inf at the pieces not kept, which the search then ranks in full."""

    def __init__(self, inner: Transformer):
        super().__init__()
        self.inner, self.training, self.specials = inner, False, inner.specials

    def encode(self, src):
        return self.inner.encode(src)

    def init_cache(self, enc):
        return _Unrestrictable(self.inner.init_cache(enc))

    def decode_step(self, tokens, cache):
        return self.inner.decode_step(tokens, cache.inner)

    def max_output_length(self):
        return self.inner.max_output_length()


class _Unrestrictable:
    def __init__(self, inner):
        self.inner = inner

    def reorder(self, indices, *, group=None, kept=None):
        self.inner.reorder(indices, group=group, kept=kept)


def _trained_restricted(restricted_run, *, drop: tuple[int, ...] = ()) -> tuple[Transformer, Tokenizer, list[str]]:
    """The restricted run's model (its kept set less the ids ``drop``), its tokenizer and 12 real validation lines."""
    out, _, cfg = restricted_run
    state = load_checkpoint(out / "checkpoint_last.pt")["model"]
    kept = state["output_ids"]
    state["output_ids"] = kept[~torch.isin(kept, torch.tensor(drop, dtype=kept.dtype))]
    v = state["src_embed.weight"].size(0)
    model = Transformer(cfg.model, src_vocab_size=v, tgt_vocab_size=v).eval()
    model.load_state_dict(state)
    return model, Tokenizer(cfg.tokenizer.model), head(Path(cfg.data.valid_src), 12)


@pytest.mark.parametrize("norm", ["pre", "scale"])
def test_the_output_layer_taken_once_per_search_scores_as_the_plain_path(norm):
    """decode_step with the cache's output matrix (taken once, at init_cache) == the plain logits() path bit for
    bit, under FixNorm too; after restrict_logits() it returns exactly the kept columns of those logits."""
    _, model = _pair(norm)
    src, tgt = tokens([6, 3, 5], seed=11), tokens([5, 7, 2], bos=True, seed=12)
    with torch.inference_mode():
        enc = model.encode(src)
        taken, plain, kept_only = model.init_cache(enc), model.init_cache(enc), model.init_cache(enc)
        assert torch.equal(taken.output.weight, model.output_weight()) and torch.equal(
            taken.output.ids, model.output_ids
        )
        plain.output = None  # a cache without the matrix: decode_step computes it as logits() does
        ids = kept_only.restrict_logits()
        assert torch.equal(ids, model.output_ids) and plain.restrict_logits() is None
        for step in range(3):
            want = model.decode_step(tgt[:, step], plain)  # (B, V)
            assert torch.equal(model.decode_step(tgt[:, step], taken), want)
            assert torch.equal(model.decode_step(tgt[:, step], kept_only), want[:, ids])  # (B, K)


@pytest.mark.parametrize("drop", [(), (BOS_ID,)], ids=["kept-set", "bos-not-kept"])
def test_search_over_the_kept_columns_equals_the_search_over_the_full_vocabulary(restricted_run, drop):
    """Greedy and beam search rank the K kept columns and map them back to ids: on real validation lines, the same
    hypotheses and scores as ranking all V ids (the others -inf), also when a never-generated id (BOS) is not kept."""
    model, tok, lines = _trained_restricted(restricted_run, drop=drop)
    src = source_tensor(tok.encode(lines))
    for beam, lenpen in [(1, 0.0), (4, 0.0), (4, 1.0)]:
        got = search(model, src, beam=beam, lenpen=lenpen, nbest=beam, max_len_a=1.2, max_len_b=5)
        want = search(FullVocabulary(model), src, beam=beam, lenpen=lenpen, nbest=beam, max_len_a=1.2, max_len_b=5)
        assert [[h.tokens for h in nb] for nb in got] == [[h.tokens for h in nb] for nb in want], (beam, lenpen)
        for g, w in zip(got, want):
            torch.testing.assert_close([h.score for h in g], [h.score for h in w], rtol=0, atol=1e-5)
            torch.testing.assert_close([h.logprob for h in g], [h.logprob for h in w], rtol=0, atol=1e-5)
        assert model.output_ids is not None
        assert all(set(h.tokens) <= set(model.output_ids.tolist()) for nb in got for h in nb)
