"""Tests of transformer_mt.model: tiny models, expectations built from the paper's formulas or from an
independent computation (the full teacher-forced pass, the same sentence alone)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_mt.config import ModelConfig
from transformer_mt.model import Transformer, count_parameters, sinusoids
from transformer_mt.tokenizer import BOS_ID, PAD_ID

V = 40  # tiny joint vocabulary
TINY = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=32, heads=4, d_ff=64, dropout=0.0, max_positions=64)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny tensors gain nothing from intra-op threads, and on a busy 2-core machine their spin-waits
    # make each op ~20x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(*, seed: int = 0, src_vocab: int = V, tgt_vocab: int = V, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(dataclasses.replace(TINY, **changes), src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab).eval()


def tokens(lengths: list[int], *, bos: bool = False, seed: int = 1) -> torch.Tensor:
    """Right-padded (B, max(lengths)) batch of random real tokens (ids >= 4), BOS first if asked."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD_ID)
    for row, n in enumerate(lengths):
        out[row, :n] = torch.randint(4, V, (n,), generator=g)
        if bos:
            out[row, 0] = BOS_ID
    return out


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
    shared = count_parameters(tiny(share_all_embeddings=True))
    separate = count_parameters(tiny(share_all_embeddings=False, share_decoder_embeddings=False))
    assert separate - shared == 2 * V * TINY.d_model


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
    model = tiny(encoder_layers=0, max_positions=8)
    src = tokens([20])
    memory = model.encode(src).memory[0]
    emb = model.src_embed.weight[src[0]]
    d = TINY.d_model
    for pos in (0, 5, 19):  # 19 is past max_positions=8: the sinusoid table grows
        for i in (0, 3, d // 2 - 1):
            angle = pos / 10000 ** (2 * i / d)
            assert memory[pos, 2 * i].item() == pytest.approx(emb[pos, 2 * i].item() * math.sqrt(d) + math.sin(angle), abs=1e-5)
            assert memory[pos, 2 * i + 1].item() == pytest.approx(emb[pos, 2 * i + 1].item() * math.sqrt(d) + math.cos(angle), abs=1e-5)


def test_learned_positions_reject_longer_inputs():
    model = tiny(positions="learned", max_positions=8)
    model.encode(tokens([8]))
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(tokens([9]))


def test_decoder_is_causal():
    model = tiny()
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
    model = tiny(norm=norm)
    src, tgt = tokens([5, 9, 7], seed=3), tokens([4, 6, 8], bos=True, seed=4)  # row 0 is padded on both sides
    enc = model.encode(src)
    batch = model.decode(tgt, enc)
    enc1 = model.encode(src[:1, :5])
    alone = model.decode(tgt[:1, :4], enc1)
    torch.testing.assert_close(enc.memory[0, :5], enc1.memory[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(batch[0, :4], alone[0], rtol=0, atol=1e-5)


def test_all_padding_rows_give_no_nan():
    model = tiny()
    src, tgt = tokens([5, 3]), tokens([4, 2], bos=True)
    src[1], tgt[1] = PAD_ID, PAD_ID  # an all-pad row must not produce NaN (SDPA on a fully masked row would)
    logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0], model(src[:1], tgt[:1])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("norm, positions, max_positions", [("post", "sinusoidal", 8), ("pre", "learned", 32), ("post", "learned", 32)])
def test_cached_decoding_matches_full_forward_through_beam_reorders(norm, positions, max_positions):
    # 20 steps: the cache outgrows its first capacity (16) and, with max_positions=8, the sinusoid table.
    model = tiny(norm=norm, positions=positions, max_positions=max_positions)
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
    model = tiny()
    src = tokens([6, 3, 5], seed=7)
    g = torch.Generator().manual_seed(8)
    cache = model.init_cache(model.encode(src))
    rows, hist = torch.arange(3), torch.full((3, 1), BOS_ID)
    reorders = {1: torch.arange(3).repeat_interleave(2), 3: torch.tensor([1, 0, 2, 3, 5, 4]), 5: torch.tensor([0, 1, 4, 5]),
                7: torch.tensor([1, 1, 2, 3])}  # finally sentence 0 keeps one beam twice: still one group
    for step in range(10):
        if step in reorders:
            idx = reorders[step]
            cache.reorder(idx)
            rows, hist = rows[idx], hist[idx]
            assert cache.group == 2 and cache.src_pad.size(0) == len(idx) // 2
        else:
            hist[:, -1] = torch.randint(4, V, (hist.size(0),), generator=g) if step else BOS_ID
        torch.testing.assert_close(model.decode_step(hist[:, -1], cache), model(src[rows], hist)[:, -1], rtol=0, atol=1e-5)
        hist = torch.cat([hist, torch.randint(4, V, (hist.size(0), 1), generator=g)], dim=1)


def test_cache_reset_forgets_the_prefix():
    model = tiny()
    src = tokens([5, 4])
    cache = model.init_cache(model.encode(src))
    first = model.decode_step(torch.full((2,), BOS_ID), cache)
    model.decode_step(torch.tensor([7, 8]), cache)
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(model.decode_step(torch.full((2,), BOS_ID), cache), first, rtol=0, atol=0)


def test_attention_weights_are_distributions_with_zeros_on_padding_and_future():
    model = tiny()
    src, tgt = tokens([6, 3, 5], seed=7), tokens([5, 7, 2], bos=True, seed=8)
    enc = model.encode(src)
    logits, weights = model.decode(tgt, enc, return_attention=True)
    torch.testing.assert_close(logits, model.decode(tgt, enc), rtol=0, atol=1e-5)  # explicit path == SDPA path
    assert len(weights) == TINY.decoder_layers
    b, t, s, h = tgt.size(0), tgt.size(1), src.size(1), TINY.heads
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    for layer in weights:
        assert layer.self_attn.shape == (b, h, t, t) and layer.cross_attn.shape == (b, h, t, s)
        for w in layer:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), rtol=0, atol=1e-6)
        assert (layer.self_attn[..., future] == 0).all()
        assert (layer.self_attn.transpose(1, 3)[tgt.eq(PAD_ID)] == 0).all()  # (B, T_k, T_q, H)[pad keys]
        assert (layer.cross_attn.transpose(1, 3)[src.eq(PAD_ID)] == 0).all()
        assert (layer.cross_attn.transpose(1, 3)[src.ne(PAD_ID)] > 0).all()


def test_fast_path_uses_sdpa_and_attention_request_does_not(monkeypatch):
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    model = tiny()
    src, tgt = tokens([5, 3]), tokens([4, 2], bos=True)
    enc = model.encode(src)
    model.decode(tgt, enc)
    assert len(calls) == TINY.encoder_layers + 2 * TINY.decoder_layers
    calls.clear()
    model.decode(tgt, enc, return_attention=True)
    assert not calls


def test_weight_sharing():
    model = tiny(share_all_embeddings=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output_proj.weight
    assert model.output_proj.bias is None
    model = tiny(src_vocab=V, tgt_vocab=V + 10, share_all_embeddings=False, share_decoder_embeddings=True)
    assert model.tgt_embed.weight is model.output_proj.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.output_proj.weight.shape == (V + 10, TINY.d_model)
    model = tiny(share_all_embeddings=False, share_decoder_embeddings=False)
    assert len({id(model.src_embed.weight), id(model.tgt_embed.weight), id(model.output_proj.weight)}) == 3
    with pytest.raises(ValueError, match="src_vocab_size=40 != tgt_vocab_size=50"):
        tiny(src_vocab=V, tgt_vocab=V + 10, share_all_embeddings=True)


def test_initialisation():
    model = tiny(d_model=64, d_ff=128)
    emb = model.src_embed.weight
    assert (emb[PAD_ID] == 0).all()
    assert emb[PAD_ID + 1 :].std().item() == pytest.approx(64**-0.5, rel=0.1)
    q = model.encoder[0].self_attn.in_weight[:64]  # W^Q alone: Xavier bound sqrt(6 / (64 + 64))
    assert q.abs().max().item() <= math.sqrt(6 / 128) and q.abs().max().item() > 0.9 * math.sqrt(6 / 128)
    assert (model.encoder[0].self_attn.in_bias == 0).all() and (model.decoder[0].ffn.fc1.bias == 0).all()


def test_training_step_gives_finite_gradients_and_dropout_only_in_training():
    model = tiny(norm="pre", positions="learned", dropout=0.3, attention_dropout=0.1, activation_dropout=0.1, activation="gelu")
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
    model = tiny(d_model=32, heads=4, head_dim=4, value_dim=8)
    attn = model.decoder[0].self_attn
    assert attn.in_weight.shape == (4 * (4 + 4 + 8), 32) and attn.out.weight.shape == (32, 4 * 8)
    src, tgt = tokens([6, 4]), tokens([5, 5], bos=True)
    full = model(src, tgt)
    assert full.shape == (2, 5, V)
    cache = model.init_cache(model.encode(src))
    for t in range(5):
        torch.testing.assert_close(model.decode_step(tgt[:, t], cache), full[:, t], rtol=0, atol=1e-5)
