"""The model options a converted checkpoint (MarianMT / OPUS-MT) needs: ``model.activation: swish``,
``model.position_layout: halves`` and ``model.output_bias``. Expectations are written out here: the FFN by hand,
the position table from its formula (and from ``transformers`` when it happens to be installed), the logits as
the bias-free model's plus the bias."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import TINY_VOCAB, tiny_model, tiny_model_config, tokens
from transformer_mt.config import ConfigError
from transformer_mt.model import TeacherForcedLoss, Transformer, choose_ops, label_smoothed_nll_loss, sinusoids
from transformer_mt.model.layers import FeedForward
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID

V = TINY_VOCAB
pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- model.activation: swish
def test_swish_ffn_is_x_sigmoid_x_between_the_two_linears():
    torch.manual_seed(0)
    ffn = FeedForward(tiny_model_config(activation="swish"), ops=choose_ops())
    x = torch.randn(2, 5, 32)
    h = x @ ffn.fc1.weight.T + ffn.fc1.bias  # (B, T, d_ff)
    want = (h * torch.sigmoid(h)) @ ffn.fc2.weight.T + ffn.fc2.bias  # (B, T, D)
    torch.testing.assert_close(ffn(x), want, rtol=0, atol=1e-5)
    assert not torch.allclose(
        want, F.relu(h) @ ffn.fc2.weight.T + ffn.fc2.bias, atol=1e-3
    )  # not relu under another name


# ---------------------------------------------------------------- model.position_layout
def marian_table(n_pos: int, dim: int) -> torch.Tensor:
    """MarianMT's sinusoid table as its formula reads: angle pos / 10000^(2 * (j // 2) / dim) for column j;
    the sines of the even columns' angles fill the first ceil(dim / 2) columns, the cosines of the odd ones the rest."""
    angle = [[pos / 10000 ** (2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_pos)]
    return torch.tensor(
        [[math.sin(a) for a in row[0::2]] + [math.cos(a) for a in row[1::2]] for row in angle], dtype=torch.float64
    )


@pytest.mark.parametrize("d", [32, 7])
def test_halves_table_equals_its_formula(d):
    torch.testing.assert_close(sinusoids(300, d, layout="halves").double(), marian_table(300, d), rtol=0, atol=1e-6)


def test_halves_table_equals_marian_when_transformers_is_installed():
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    emb = marian.MarianSinusoidalPositionalEmbedding(64, 32)
    if hasattr(emb, "create_weight"):  # the newest releases return the table from create_weight()
        filled = emb.create_weight()
    else:
        try:
            filled = emb._init_weight()  # newer releases fill emb.weight in place
        except TypeError:
            filled = emb._init_weight(emb.weight)  # older ones return the table
    weight = emb.weight if filled is None else filled
    torch.testing.assert_close(sinusoids(64, 32, layout="halves"), weight.detach().float(), rtol=0, atol=1e-6)


def test_interleaved_table_is_the_default_and_unchanged():
    d = 32
    pe = sinusoids(100, d)
    assert torch.equal(pe, sinusoids(100, d, layout="interleaved"))
    halves = sinusoids(100, d, layout="halves")
    assert torch.equal(pe[:, 0::2], halves[:, : d // 2]) and torch.equal(
        pe[:, 1::2], halves[:, d // 2 :]
    )  # the same values, reordered
    assert torch.equal(tiny_model().pe, sinusoids(64, d))
    with pytest.raises(ValueError, match=r"layout='split' is not one of interleaved, halves"):
        sinusoids(10, d, layout="split")


def test_model_adds_the_halves_table_from_position_0():
    # No encoder layer (post-norm: no final norm): the memory is scaled embedding + position, the first piece at
    # position 0.
    model = tiny_model(encoder_layers=0, position_layout="halves")
    src = tokens([9])
    memory = model.encode(src).memory[0]  # (S, D)
    want = model.src_embed.weight[src[0]] * math.sqrt(32) + marian_table(9, 32).float()
    torch.testing.assert_close(memory, want, rtol=0, atol=1e-5)
    model.reserve_positions(80)  # grown in the same layout
    torch.testing.assert_close(model.pe.double(), marian_table(80, 32), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- model.output_bias
def _with_and_without_bias(**changes):
    """The same random weights twice, with and without ``model.output_bias`` (a random bias)."""
    plain, biased = tiny_model(**changes), tiny_model(output_bias=True, **changes)
    assert biased.load_state_dict(plain.state_dict(), strict=False).missing_keys == ["output_proj.bias"]
    assert torch.equal(biased.output_proj.bias, torch.zeros(V))  # zero at start: the logits start as without it
    with torch.no_grad():
        biased.output_proj.bias.copy_(torch.randn(V, generator=torch.Generator().manual_seed(3)))
    return plain, biased


def test_output_bias_is_a_parameter_only_when_asked():
    plain, biased = _with_and_without_bias()
    assert "output_proj.bias" not in plain.state_dict() and plain.output_proj.bias is None
    assert set(biased.state_dict()) - set(plain.state_dict()) == {"output_proj.bias"}
    assert any(p is biased.output_proj.bias for p in biased.parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_output_bias_adds_exactly_the_bias_to_decode_and_decode_step(tied):
    plain, biased = _with_and_without_bias(share_all_embeddings=tied, share_decoder_embeddings=tied)
    assert (biased.output_proj.weight is biased.tgt_embed.weight) == tied
    bias = biased.output_proj.bias.detach()
    src, tgt = tokens([6, 3], seed=11), tokens([5, 4], bos=True, seed=12)
    with torch.no_grad():
        torch.testing.assert_close(biased(src, tgt), plain(src, tgt) + bias, rtol=0, atol=1e-5)
        cache_plain, cache_biased = plain.init_cache(plain.encode(src)), biased.init_cache(biased.encode(src))
        for step in range(tgt.size(1)):
            torch.testing.assert_close(
                biased.decode_step(tgt[:, step], cache_biased),
                plain.decode_step(tgt[:, step], cache_plain) + bias,
                rtol=0,
                atol=1e-5,
            )


def test_output_bias_with_restrict_output_keeps_the_kept_entries():
    plain, biased = _with_and_without_bias(restrict_output=True)
    kept = torch.tensor([PAD_ID, 1, BOS_ID, EOS_ID, 5, 9, 20, 33])
    plain.restrict_output_to(kept)
    biased.restrict_output_to(kept)
    bias = biased.output_proj.bias.detach()
    torch.testing.assert_close(biased.output_bias(), bias[kept], rtol=0, atol=0)
    src, tgt = tokens([6, 3], seed=11), tokens([5, 4], bos=True, seed=12)
    with torch.no_grad():
        got, want = biased(src, tgt), plain(src, tgt)
    torch.testing.assert_close(got[..., kept], want[..., kept] + bias[kept], rtol=0, atol=1e-5)
    assert got.isinf().sum() == want.isinf().sum() == got[..., kept].numel() // kept.numel() * (V - kept.numel())


def _targets(tgt_in: torch.Tensor) -> torch.Tensor:
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((tgt_in.size(0), 1), PAD_ID)], dim=1)
    tgt_out[0, -1], tgt_out[1, 2] = EOS_ID, EOS_ID
    return tgt_out


@pytest.mark.parametrize("reference_ops", [False, True])
@pytest.mark.parametrize("restrict", [False, True])
def test_fused_loss_includes_the_output_bias(reference_ops, restrict):
    """TeacherForcedLoss (the fused projection + loss, or its plain path) equals the loss of the explicit
    logits + bias, in value and in every gradient, the bias's included."""
    _, biased = _with_and_without_bias(restrict_output=restrict)
    if restrict:
        biased.restrict_output_to(torch.arange(4, V, 2))
    src, tgt_in = tokens([6, 3], seed=3), tokens([4, 3], bos=True, seed=4)
    tgt_out = _targets(tgt_in)
    if restrict:
        tgt_out[tgt_out.gt(EOS_ID)] = tgt_out[tgt_out.gt(EOS_ID)] // 2 * 2  # targets among the kept pieces
    biased.use_ops(choose_ops("reference" if reference_ops else "cpu"))
    loss, nll, n = TeacherForcedLoss(biased, label_smoothing=0.1)(src, tgt_in, tgt_out)
    biased.use_ops(choose_ops("cpu"))
    loss.backward()
    got = {name: p.grad.clone() for name, p in biased.named_parameters()}
    biased.zero_grad()
    h = biased.decoder_output(tgt_in, biased.encode(src))[tgt_out.ne(PAD_ID)]  # (N, D)
    keep = biased.output_ids if restrict else torch.arange(V)
    logits = h @ biased.output_proj.weight[keep].T + biased.output_proj.bias[keep]  # (N, K), the bias by hand
    want_loss, want_nll, want_n = label_smoothed_nll_loss(
        logits, biased.output_targets(tgt_out[tgt_out.ne(PAD_ID)]), epsilon=0.1
    )
    want_loss.backward()
    assert n == want_n == 7
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-5) and nll.item() == pytest.approx(
        want_nll.item(), rel=1e-5
    )
    assert got["output_proj.bias"].abs().sum() > 0
    for name, p in biased.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------- incremental decoding with each option
OPTIONS = [
    {"activation": "swish"},
    {"position_layout": "halves"},
    {"output_bias": True},
    {"output_bias": True, "restrict_output": True},
]


@pytest.mark.parametrize("changes", OPTIONS)
def test_cached_decoding_matches_full_forward_with_each_option(changes):
    model = tiny_model(norm="pre", max_positions=8, **changes)
    if changes.get("output_bias"):
        with torch.no_grad():
            model.output_proj.bias.normal_(generator=torch.Generator().manual_seed(2))
    if changes.get("restrict_output"):
        model.restrict_output_to(torch.arange(4, V, 3))
    model.reserve_positions(13)  # past max_positions: the table grows in its layout
    src = tokens([6, 3], seed=5)
    g = torch.Generator().manual_seed(6)
    cache = model.init_cache(model.encode(src))
    rows, hist = torch.arange(2), torch.full((2, 1), BOS_ID)
    with torch.no_grad():
        for step in range(12):
            if step == 4:  # a beam reorder: expand to 2 x beam 2, then continue
                idx = torch.tensor([0, 0, 1, 1])
                cache.reorder(idx)
                rows, hist = rows[idx], hist[idx]
            torch.testing.assert_close(
                model.decode_step(hist[:, -1], cache), model(src[rows], hist)[:, -1], rtol=0, atol=1e-5
            )
            hist = torch.cat([hist, torch.randint(4, V, (hist.size(0), 1), generator=g)], dim=1)


# ---------------------------------------------------------------- refused values
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"activation": "silu"}, r"model\.activation='silu' is not one of relu, gelu, swish"),
        ({"position_layout": "split"}, r"model\.position_layout='split' is not one of interleaved, halves"),
        (
            {"positions": "learned", "position_layout": "halves"},
            r"model\.position_layout='halves' orders sinusoids only",
        ),
    ],
)
def test_model_refuses_bad_option_values(changes, message):
    with pytest.raises(ConfigError, match=message):
        Transformer(tiny_model_config(**changes), src_vocab_size=V, tgt_vocab_size=V)
