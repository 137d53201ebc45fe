"""Tests of the Transformer (transformer_mt.model): tiny models, expectations built from the paper's formulas or from an
independent computation (the full teacher-forced pass, the same sentence alone)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import TINY_MODEL, TINY_VOCAB, tiny_model, tokens
from transformer_mt.config import ModelConfig
from transformer_mt.model import Transformer, count_parameters, sinusoids
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID

V = TINY_VOCAB  # the tiny models' joint vocabulary (40 ids)
pytestmark = pytest.mark.usefixtures("one_thread")


def expected_count(*, vocab: int, n: int, d: int, d_ff: int) -> int:
    """Section 3 from first principles: one shared V x D matrix, 4 D x D (+bias) per attention,
    two FFN matrices (+biases), LayerNorm gain and bias per sublayer."""
    attn = 4 * (d * d + d)
    ffn = 2 * d * d_ff + d_ff + d
    return vocab * d + n * (attn + ffn + 2 * 2 * d) + n * (2 * attn + ffn + 3 * 2 * d)


@pytest.mark.parametrize(
    "n, d, d_ff, heads, low, high",
    [(6, 512, 2048, 8, 60e6, 66e6), (6, 1024, 4096, 16, 205e6, 216e6)],  # paper: 65M base, 213M big
)
def test_parameter_counts_of_base_and_big(n, d, d_ff, heads, low, high):
    cfg = ModelConfig(encoder_layers=n, decoder_layers=n, d_model=d, d_ff=d_ff, heads=heads)
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = Transformer(cfg, src_vocab_size=37000, tgt_vocab_size=37000)
    count = count_parameters(model)
    assert count == expected_count(vocab=37000, n=n, d=d, d_ff=d_ff)
    assert low <= count <= high


def test_shared_matrix_counted_once():
    shared = count_parameters(tiny_model(share_all_embeddings=True))
    separate = count_parameters(tiny_model(share_all_embeddings=False, share_decoder_embeddings=False))
    assert separate - shared == 2 * V * TINY_MODEL.d_model


def test_sinusoids_follow_the_paper_formula():
    d = 32
    pe = sinusoids(3000, d)
    for pos in (0, 1, 7, 100, 999, 2999):
        for i in (0, 1, 5, d // 2 - 1):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_encoder_input_is_scaled_embedding_plus_position_and_grows_past_max_positions():
    # With no encoder layer (post-norm: no final LayerNorm) the memory is the encoder input itself.
    model = tiny_model(encoder_layers=0, max_positions=8)
    src = tokens([20])
    with pytest.raises(ValueError, match=r"reserve_positions\(20\)"):  # encoding and decoding never grow the table
        model.encode(src)
    assert model.pe.size(0) == 8
    with torch.inference_mode():
        model.reserve_positions(20)  # grown once, up front (a normal tensor even under inference_mode)
    assert model.pe.size(0) == 20 and not model.pe.is_inference()
    memory = model.encode(src).memory[0]
    emb = model.src_embed.weight[src[0]]
    d = TINY_MODEL.d_model
    for pos in (0, 5, 19):  # 19 is past max_positions=8: the sinusoid table grows
        for i in (0, 3, d // 2 - 1):
            angle = pos / 10000 ** (2 * i / d)
            assert memory[pos, 2 * i].item() == pytest.approx(
                emb[pos, 2 * i].item() * math.sqrt(d) + math.sin(angle), abs=1e-5
            )
            assert memory[pos, 2 * i + 1].item() == pytest.approx(
                emb[pos, 2 * i + 1].item() * math.sqrt(d) + math.cos(angle), abs=1e-5
            )


def test_learned_positions_reject_longer_inputs():
    model = tiny_model(positions="learned", max_positions=8)
    model.encode(tokens([8]))
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(tokens([9]))


def test_decoder_is_causal():
    model = tiny_model()
    src, tgt = tokens([6, 4]), tokens([7, 7], bos=True, seed=2)
    enc = model.encode(src)
    before = model.decode(tgt, enc)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = torch.randint(4, V, changed[:, t + 1 :].shape)
        after = model.decode(changed, enc)
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_sentence_alone_equals_sentence_in_a_padded_batch(norm):
    model = tiny_model(norm=norm)
    src, tgt = tokens([5, 9, 7], seed=3), tokens([4, 6, 8], bos=True, seed=4)  # row 0 is padded on both sides
    enc = model.encode(src)
    batch = model.decode(tgt, enc)
    enc1 = model.encode(src[:1, :5])
    alone = model.decode(tgt[:1, :4], enc1)
    torch.testing.assert_close(enc.memory[0, :5], enc1.memory[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(batch[0, :4], alone[0], rtol=0, atol=1e-5)


def test_all_padding_rows_give_no_nan():
    model = tiny_model()
    src, tgt = tokens([5, 3]), tokens([4, 2], bos=True)
    src[1], tgt[1] = PAD_ID, PAD_ID  # an all-pad row must not produce NaN (SDPA on a fully masked row would)
    logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0], model(src[:1], tgt[:1])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "norm, positions, max_positions", [("post", "sinusoidal", 8), ("pre", "learned", 32), ("post", "learned", 32)]
)
def test_cached_decoding_matches_full_forward_through_beam_reorders(norm, positions, max_positions):
    # 20 steps: the cache outgrows its first capacity (16) and, with max_positions=8, the sinusoid table
    # (reserved up front, as Translator and translate_ids do).
    model = tiny_model(norm=norm, positions=positions, max_positions=max_positions)
    model.reserve_positions(21)
    src = tokens([6, 3], seed=5)
    g = torch.Generator().manual_seed(6)
    cache = model.init_cache(model.encode(src))
    rows = torch.arange(2)  # source sentence of each cache row
    hist = torch.full((2, 1), BOS_ID)  # tokens fed so far, per row
    reorders = {
        3: torch.arange(2).repeat_interleave(3),  # expand to 2 x beam 3
        6: torch.tensor([2, 0, 1, 4, 5, 3]),  # permute beams within each sentence
        9: torch.tensor([5, 1, 0, 3, 4, 2]),  # move rows across sentences
        12: torch.tensor([0, 2, 3, 5]),  # drop rows
    }
    for step in range(20):
        if step in reorders:
            idx = reorders[step]
            cache.reorder(idx)
            rows, hist = rows[idx], hist[idx]
            # the source side is stored once per group of `cache.group` rows of one sentence
            assert cache.batch_size == len(idx) and cache.src_pad.size(0) * cache.group == len(idx)
            assert torch.equal(cache.src_pad.repeat_interleave(cache.group, 0), src[rows].eq(PAD_ID))
        else:
            hist[:, -1] = torch.randint(4, V, (hist.size(0),), generator=g) if step else BOS_ID
        logits = model.decode_step(hist[:, -1], cache)
        full = model(src[rows], hist)[:, -1]
        torch.testing.assert_close(logits, full, rtol=0, atol=1e-5)
        assert cache.length == hist.size(1)
        hist = torch.cat([hist, torch.randint(4, V, (hist.size(0), 1), generator=g)], dim=1)


def test_cached_decoding_when_grouped_sentences_leave_the_batch():
    """Beam search's pattern: 3 sentences x beam 2, beams permuted within sentences, then the middle
    sentence finishes and leaves; each remaining row must still match the full forward of its prefix."""
    model = tiny_model()
    src = tokens([6, 3, 5], seed=7)
    g = torch.Generator().manual_seed(8)
    cache = model.init_cache(model.encode(src))
    rows, hist = torch.arange(3), torch.full((3, 1), BOS_ID)
    reorders = {
        1: torch.arange(3).repeat_interleave(2),
        3: torch.tensor([1, 0, 2, 3, 5, 4]),
        5: torch.tensor([0, 1, 4, 5]),
        7: torch.tensor([1, 1, 2, 3]),
    }  # finally sentence 0 keeps one beam twice: still one group
    for step in range(10):
        if step in reorders:
            idx = reorders[step]
            cache.reorder(idx)
            rows, hist = rows[idx], hist[idx]
            assert cache.group == 2 and cache.src_pad.size(0) == len(idx) // 2
        else:
            hist[:, -1] = torch.randint(4, V, (hist.size(0),), generator=g) if step else BOS_ID
        torch.testing.assert_close(
            model.decode_step(hist[:, -1], cache), model(src[rows], hist)[:, -1], rtol=0, atol=1e-5
        )
        hist = torch.cat([hist, torch.randint(4, V, (hist.size(0), 1), generator=g)], dim=1)


def test_cache_reset_forgets_the_prefix():
    model = tiny_model()
    src = tokens([5, 4])
    cache = model.init_cache(model.encode(src))
    first = model.decode_step(torch.full((2,), BOS_ID), cache)
    model.decode_step(torch.tensor([7, 8]), cache)
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(model.decode_step(torch.full((2,), BOS_ID), cache), first, rtol=0, atol=0)


def test_attention_weights_are_distributions_with_zeros_on_padding_and_future():
    model = tiny_model()
    src, tgt = tokens([6, 3, 5], seed=7), tokens([5, 7, 2], bos=True, seed=8)
    with torch.no_grad():
        weights = model.attention(src, tgt)
        real = tgt.ne(PAD_ID)  # explicit path == SDPA path at real positions (decode leaves padded ones unspecified)
        torch.testing.assert_close(weights.logits[real], model.decode(tgt, model.encode(src))[real], rtol=0, atol=1e-5)
    assert (
        len(weights.encoder) == TINY_MODEL.encoder_layers
        and len(weights.decoder) == len(weights.cross) == TINY_MODEL.decoder_layers
    )
    b, t, s, h = tgt.size(0), tgt.size(1), src.size(1), TINY_MODEL.heads
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    for enc_w in weights.encoder:
        assert enc_w.shape == (b, h, s, s)
        torch.testing.assert_close(enc_w.sum(-1), torch.ones(b, h, s), rtol=0, atol=1e-6)
        assert (enc_w.transpose(1, 3)[src.eq(PAD_ID)] == 0).all()  # (B, S_k, S_q, H)[pad keys]
    for self_w, cross_w in zip(weights.decoder, weights.cross):
        assert self_w.shape == (b, h, t, t) and cross_w.shape == (b, h, t, s)
        for w in (self_w, cross_w):
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), rtol=0, atol=1e-6)
        assert (self_w[..., future] == 0).all()
        assert (self_w.transpose(1, 3)[tgt.eq(PAD_ID)] == 0).all()  # (B, T_k, T_q, H)[pad keys]
        assert (cross_w.transpose(1, 3)[src.eq(PAD_ID)] == 0).all()
        assert (cross_w.transpose(1, 3)[src.ne(PAD_ID)] > 0).all()


def reference_pass(
    model: Transformer, src: torch.Tensor, tgt_in: torch.Tensor
) -> tuple[list, list, list, torch.Tensor]:
    """An independent float64 re-computation of the teacher-forced pass from the model's parameters:
    every attention is softmax(Q K^T / sqrt(d_k)) with Q, K, V taken from the model's own projection
    matrices and the masks built here (source padding; causal + target padding). Returns the encoder,
    decoder-self and cross weights per layer and the logits."""
    cfg, d = model.cfg, model.cfg.d_model
    dd = lambda t: t.detach().double()  # noqa: E731

    def norm(ln, x):
        return F.layer_norm(x, (d,), dd(ln.weight), dd(ln.bias), ln.eps)

    def mha(attn, xq, xkv, allowed):  # (B, Tq, D), (B, Tk, D), (B, 1|Tq, Tk) bool True = attend
        h, dk, dv = cfg.heads, d // cfg.heads, d // cfg.heads
        w, b = dd(attn.in_weight), dd(attn.in_bias)
        q = (xq @ w[: h * dk].T + b[: h * dk]).unflatten(-1, (h, dk)).transpose(1, 2)  # (B, H, Tq, dk)
        k = (xkv @ w[h * dk : 2 * h * dk].T + b[h * dk : 2 * h * dk]).unflatten(-1, (h, dk)).transpose(1, 2)
        v = (xkv @ w[2 * h * dk :].T + b[2 * h * dk :]).unflatten(-1, (h, dv)).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(dk)).masked_fill(~allowed[:, None], float("-inf"))
        weights = scores.softmax(-1)  # (B, H, Tq, Tk)
        out = (weights @ v).transpose(1, 2).flatten(2)  # (B, Tq, H*dv)
        return out @ dd(attn.out.weight).T + dd(attn.out.bias), weights

    def ffn(f, x):
        return torch.relu(x @ dd(f.fc1.weight).T + dd(f.fc1.bias)) @ dd(f.fc2.weight).T + dd(f.fc2.bias)

    def sublayer(x, fn, ln):  # post-norm LayerNorm(x + f(x)); pre-norm x + f(LayerNorm(x))
        if cfg.norm == "pre":
            return x + fn(norm(ln, x))
        return norm(ln, x + fn(x))

    def embed(table, ids):
        pos = torch.arange(ids.size(1), dtype=torch.float64)[:, None]
        i = torch.arange(0, d, 2, dtype=torch.float64)
        pe = torch.zeros(ids.size(1), d, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos / 10000 ** (i / d)), torch.cos(pos / 10000 ** (i / d))
        return dd(table.weight)[ids] * math.sqrt(d) + pe

    src_ok, tgt_ok = src.ne(PAD_ID), tgt_in.ne(PAD_ID)
    t = tgt_in.size(1)
    enc_allowed = src_ok[:, None, :]  # (B, 1, S)
    dec_allowed = tgt_ok[:, None, :] & torch.ones(t, t, dtype=torch.bool).tril()  # (B, T, T)
    enc_w, self_w, cross_w = [], [], []
    x = embed(model.src_embed, src)
    for layer in model.encoder:

        def attend(h, layer=layer):
            out, w = mha(layer.self_attn, h, h, enc_allowed)
            enc_w.append(w)
            return out

        x = sublayer(sublayer(x, attend, layer.norm1), lambda h, layer=layer: ffn(layer.ffn, h), layer.norm2)
    memory = norm(model.encoder_norm, x) if cfg.norm == "pre" else x
    y = embed(model.tgt_embed, tgt_in)
    for dec in model.decoder:

        def self_attend(h, dec=dec):
            out, w = mha(dec.self_attn, h, h, dec_allowed)
            self_w.append(w)
            return out

        def cross_attend(h, dec=dec):
            out, w = mha(dec.cross_attn, h, memory, enc_allowed)
            cross_w.append(w)
            return out

        y = sublayer(
            sublayer(sublayer(y, self_attend, dec.norm1), cross_attend, dec.norm2),
            lambda h, dec=dec: ffn(dec.ffn, h),
            dec.norm3,
        )
    if cfg.norm == "pre":
        y = norm(model.decoder_norm, y)
    return enc_w, self_w, cross_w, y @ dd(model.output_proj.weight).T


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_attention_weights_equal_an_independent_computation(norm):
    model = tiny_model(norm=norm, encoder_layers=2, decoder_layers=3)
    src, tgt = tokens([6, 3, 5], seed=11), tokens([5, 7, 2], bos=True, seed=12)  # padding on both sides
    with torch.no_grad():
        got = model.attention(src, tgt)
    enc_w, self_w, cross_w, logits = reference_pass(model, src, tgt)
    assert (len(got.encoder), len(got.decoder), len(got.cross)) == (2, 3, 3)
    for ours, theirs in zip(got.encoder + got.decoder + got.cross, enc_w + self_w + cross_w):
        torch.testing.assert_close(ours.double(), theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.logits.double(), logits, rtol=0, atol=1e-4)


def test_translation_is_the_same_with_and_without_weight_capture():
    """Capturing weights leaves the model as it was (same translations before and after), and teacher-
    forcing the greedy translation through attention() predicts that translation again, token by token."""
    from transformer_mt.decoding import greedy_search, search

    model = tiny_model(seed=3)
    src = tokens([6, 3, 5], seed=13)
    before = [search(model, src, beam=beam, max_len_b=8, nbest=1) for beam in (1, 3)]
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=8)
    longest = max(len(h.tokens) for h in greedy)
    tgt_in = torch.full((3, longest + 1), PAD_ID)
    for row, hyp in enumerate(greedy):
        tgt_in[row, : len(hyp.tokens) + 1] = torch.tensor([BOS_ID, *hyp.tokens])
    with torch.no_grad():
        weights = model.attention(src, tgt_in)
    logits = weights.logits.clone()
    logits[..., PAD_ID] = logits[..., BOS_ID] = float("-inf")  # the search never generates them
    limits = (src.ne(PAD_ID).sum(1) + 8).tolist()  # floor(1.0 * source tokens + 8)
    for row, hyp in enumerate(greedy):
        predicted = logits[row, : len(hyp.tokens) + 1].argmax(-1).tolist()
        assert predicted[: len(hyp.tokens)] == hyp.tokens
        if len(hyp.tokens) < limits[row]:  # it stopped at EOS, not at its length limit
            assert predicted[-1] == EOS_ID
    assert [search(model, src, beam=beam, max_len_b=8, nbest=1) for beam in (1, 3)] == before


def test_fast_path_uses_sdpa_and_attention_request_does_not(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    model = tiny_model()
    # SDPA's path as GPUs and long sentences take it (a CPU training step over few keys spells it out instead)
    monkeypatch.setattr(model.ops, "spelled_out_is_faster", lambda k: False)
    src, tgt = tokens([5, 3]), tokens([4, 2], bos=True)
    enc = model.encode(src)
    assert len(calls) == TINY_MODEL.encoder_layers
    calls.clear()
    model.decode(tgt, enc)
    assert len(calls) == 2 * TINY_MODEL.decoder_layers
    calls.clear()
    model.attention(src, tgt)
    assert not calls


def test_weight_sharing():
    model = tiny_model(share_all_embeddings=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_proj.weight
    assert model.output_proj.bias is None
    model = tiny_model(src_vocab=V, tgt_vocab=V + 10, share_all_embeddings=False, share_decoder_embeddings=True)
    assert model.tgt_embed.weight is model.output_proj.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.output_proj.weight.shape == (V + 10, TINY_MODEL.d_model)
    model = tiny_model(share_all_embeddings=False, share_decoder_embeddings=False)
    assert len({id(model.src_embed.weight), id(model.tgt_embed.weight), id(model.output_proj.weight)}) == 3
    with pytest.raises(ValueError, match="src_vocab_size=40 != tgt_vocab_size=50"):
        tiny_model(src_vocab=V, tgt_vocab=V + 10, share_all_embeddings=True)


def test_initialisation():
    model = tiny_model(d_model=64, d_ff=128)
    emb = model.src_embed.weight
    assert (emb[PAD_ID] == 0).all()
    assert emb[PAD_ID + 1 :].std().item() == pytest.approx(64**-0.5, rel=0.1)
    q = model.encoder[0].self_attn.in_weight[:64]  # W^Q alone: Xavier bound sqrt(6 / (64 + 64))
    assert q.abs().max().item() <= math.sqrt(6 / 128) and q.abs().max().item() > 0.9 * math.sqrt(6 / 128)
    assert (model.encoder[0].self_attn.in_bias == 0).all() and (model.decoder[0].ffn.fc1.bias == 0).all()


def test_training_step_gives_finite_gradients_and_dropout_only_in_training():
    model = tiny_model(
        norm="pre", positions="learned", dropout=0.3, attention_dropout=0.1, activation_dropout=0.1, activation="gelu"
    )
    src, tgt = tokens([6, 4], seed=9), tokens([5, 3], bos=True, seed=10)
    labels = tokens([5, 3], seed=11)
    model.train()
    logits = model(src, tgt)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD_ID)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert not torch.allclose(model(src, tgt), model(src, tgt))  # dropout is active
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(src, tgt), rtol=0, atol=0)


def test_head_and_value_sizes_independent_of_d_model():
    model = tiny_model(d_model=32, heads=4, head_dim=4, value_dim=8)
    attn = model.decoder[0].self_attn
    assert attn.in_weight.shape == (4 * (4 + 4 + 8), 32) and attn.out.weight.shape == (32, 4 * 8)
    src, tgt = tokens([6, 4]), tokens([5, 5], bos=True)
    full = model(src, tgt)
    assert full.shape == (2, 5, V)
    cache = model.init_cache(model.encode(src))
    for t in range(5):
        torch.testing.assert_close(model.decode_step(tgt[:, t], cache), full[:, t], rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_unmasked_attention_paths_equal_the_masked_ones(norm):
    """SDPA without a mask tensor where none is needed: the teacher-forced decoder's self-attention
    is causal only (is_causal=True) and a source without padding gets no key mask. At every real position the
    outputs and all parameter gradients equal those of the full masks (causal + padding), which this test
    builds itself and feeds through the same layers."""
    from transformer_mt.model import allowed_mask

    def run(model, src, tgt, *, explicit: bool, padded: bool = True):
        model.zero_grad()
        enc = model.encode(src) if explicit else model.encode(src, padded=padded)
        x = model._embed(model.tgt_embed, tgt)
        self_allowed = allowed_mask(tgt.eq(PAD_ID), causal=True) if explicit else None  # (B, 1, T, T)
        for layer in model.decoder:
            k, v = layer.cross_attn.project_kv(enc.memory)
            x, _ = layer(x, k, v, self_allowed=self_allowed, causal=not explicit, cross_allowed=enc.allowed)
        if model.decoder_norm is not None:
            x = model.decoder_norm(x)
        real = tgt.ne(PAD_ID)
        (x[real] ** 2).sum().backward()  # any loss over the real positions
        return x[real].detach(), [p.grad.clone() for p in model.parameters()]

    model = tiny_model(norm=norm).train()  # dropout 0: the paths must not differ by a random mask
    src, tgt = tokens([6, 3, 5], seed=3), tokens([5, 7, 2], bos=True, seed=4)
    want, want_grads = run(model, src, tgt, explicit=True)
    got, got_grads = run(model, src, tgt, explicit=False)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    # a source without padding: padded=False (no key mask at all) against the all-True mask
    full = tokens([6, 6], seed=5)
    want, want_grads = run(model, full, tgt[:2], explicit=True)
    got, got_grads = run(model, full, tgt[:2], explicit=False, padded=False)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_decoder_self_attention_in_training_runs_sdpa_causal_without_a_mask(monkeypatch):
    seen = []
    sdpa = F.scaled_dot_product_attention

    def noted(*args, **kwargs):
        seen.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", noted)
    model = tiny_model()
    # SDPA's path, as GPUs and long sentences take it
    monkeypatch.setattr(model.ops, "spelled_out_is_faster", lambda k: False)
    src, tgt = tokens([5, 5]), tokens([4, 2], bos=True)  # the source has no padding
    model.decode(tgt, model.encode(src, padded=False))
    assert seen[: TINY_MODEL.encoder_layers] == [(None, False)] * TINY_MODEL.encoder_layers
    assert (
        seen[TINY_MODEL.encoder_layers :] == [(None, True), (None, False)] * TINY_MODEL.decoder_layers
    )  # self (causal), cross


def test_stated_reorder_layout_equals_the_worked_out_one():
    """DecoderCache.reorder with the layout stated (group, kept: what the searches pass, no host sync) leaves
    the cache exactly as a bare reorder that reads the indices back: beams expanded, permuted, one sentence dropped."""
    model = tiny_model()
    src = tokens([6, 3, 5], seed=7)
    enc = model.encode(src)
    bare, stated = model.init_cache(enc), model.init_cache(enc)
    steps = [
        (torch.arange(3).repeat_interleave(2), 2, None),
        (torch.tensor([1, 0, 2, 3, 5, 4]), 2, None),
        (torch.tensor([0, 1, 4, 5]), 2, torch.tensor([0, 2])),
        (torch.tensor([2, 3]), 2, torch.tensor([1])),
    ]
    tok = torch.full((3,), BOS_ID)
    for idx, group, kept in steps:
        a, b = model.decode_step(tok, bare), model.decode_step(tok, stated)
        assert torch.equal(a, b)
        bare.reorder(idx)
        stated.reorder(idx, group=group, kept=kept)
        assert (bare.group, bare.batch_size) == (stated.group, stated.batch_size)
        for name in ("cross_k", "cross_v", "src_pad", "cross_allowed"):
            assert torch.equal(getattr(bare, name), getattr(stated, name)), name
        tok = a.argmax(-1)[idx]
    assert torch.equal(model.decode_step(tok, bare), model.decode_step(tok, stated))


def test_weights_cast_for_inference_keep_norms_and_positions_in_float32():
    model = tiny_model()
    ref = model.state_dict()
    src, tgt = tokens([6, 3], seed=2), tokens([4, 5], bos=True, seed=3)
    with torch.no_grad():
        want = model(src, tgt)
        model.cast_weights(torch.bfloat16)
        got = model(src, tgt)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(p.dtype == torch.float32 for m in norms for p in m.parameters())
    assert model.pe.dtype == torch.float32
    assert (
        model.output_proj.weight.dtype
        == model.src_embed.weight.dtype
        == model.encoder[0].ffn.fc1.weight.dtype
        == torch.bfloat16
    )
    assert model.state_dict().keys() == ref.keys()
    assert got.dtype == torch.bfloat16
    real = tgt.ne(PAD_ID)
    torch.testing.assert_close(got[real].float(), want[real], rtol=0.05, atol=0.1)  # bf16 rounding of the weights only
