"""model.norm: scale, "Transformers without Tears" (Nguyen & Salazar 2019): ScaleNorm in pre-norm places and
FixNorm word embeddings. Expectations from the formulas, computed here from the model's parameters."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import TINY_MODEL, TINY_VOCAB, head, run_config, tiny_model, tokens
from transformer_mt.model import LayerNorm, ScaleNorm, Transformer, allowed_mask, count_parameters, sinusoids
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID

V, D = TINY_VOCAB, TINY_MODEL.d_model
pytestmark = pytest.mark.usefixtures("one_thread")


def _scale_model(**changes):
    """A tiny norm=scale model whose ScaleNorm gains are set away from their initial sqrt(d) (so a test sees each
    one)."""
    model = tiny_model(norm="scale", **changes)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ScaleNorm):
                m.g.fill_(float(torch.empty(()).uniform_(2.0, 8.0, generator=g)))
    return model


def test_scalenorm_is_g_times_x_over_its_l2_norm():
    norm = ScaleNorm(D)
    assert norm.g.shape == () and norm.g.item() == pytest.approx(math.sqrt(D))  # the authors' initial value
    with torch.no_grad():
        norm.g.fill_(2.5)
    x = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    want = [
        [[2.5 * c / math.sqrt(sum(c * c for c in v)) for c in v] for v in row] for row in x.double().tolist()
    ]  # by hand
    torch.testing.assert_close(norm(x).double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-6)
    assert norm(torch.zeros(2, D)).eq(0).all()  # max(||x||, eps): a zero vector stays zero, no NaN
    # bfloat16 input: normalised in float32 (g's dtype), returned in bfloat16
    torch.testing.assert_close(norm(x.bfloat16()), norm(x.bfloat16().float()).bfloat16(), rtol=0, atol=0)


def test_every_layernorm_replaced_and_the_parameter_count():
    pre, scale = tiny_model(norm="pre"), tiny_model(norm="scale")
    norms = [m for m in scale.modules() if isinstance(m, (LayerNorm, ScaleNorm))]
    n = 2 * TINY_MODEL.encoder_layers + 3 * TINY_MODEL.decoder_layers + 2  # per sublayer + one final norm per stack
    assert len(norms) == n and all(isinstance(m, ScaleNorm) for m in norms)
    assert count_parameters(pre) - count_parameters(scale) == n * (
        2 * D - 1
    )  # LayerNorm gain + bias (2D) -> one scalar g


def _by_hand(model, src, tgt_in):
    """The norm=scale teacher-forced logits rebuilt here: FixNorm embeddings e / ||e|| * sqrt(d) + sinusoids, pre-norm
    sublayers x + f(g x / ||x||) with the model's attention / FFN modules, final ScaleNorm per stack, output layer
    h . w_v / ||w_v||."""
    sn = lambda norm, x: norm.g * x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    unit = lambda w: w / w.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # noqa: E731 - the PAD row is 0

    def embed(table, ids):
        return unit(table.weight[ids]) * math.sqrt(D) + sinusoids(ids.size(1), D)

    enc_allowed, dec_allowed = allowed_mask(src.eq(PAD_ID)), allowed_mask(tgt_in.eq(PAD_ID), causal=True)
    x = embed(model.src_embed, src)
    for layer in model.encoder:
        x = x + layer.self_attn.attend(*layer.self_attn.project_qkv(sn(layer.norm1, x)), enc_allowed)[0]
        x = x + layer.ffn(sn(layer.norm2, x))
    memory = sn(model.encoder_norm, x)
    y = embed(model.tgt_embed, tgt_in)
    for layer in model.decoder:
        y = y + layer.self_attn.attend(*layer.self_attn.project_qkv(sn(layer.norm1, y)), dec_allowed)[0]
        y = (
            y
            + layer.cross_attn.attend(
                layer.cross_attn.project_q(sn(layer.norm2, y)), *layer.cross_attn.project_kv(memory), enc_allowed
            )[0]
        )
        y = y + layer.ffn(sn(layer.norm3, y))
    return sn(model.decoder_norm, y) @ unit(model.output_proj.weight).T


@pytest.mark.parametrize("tied", [True, False])
def test_scale_model_equals_the_formulas(tied):
    model = _scale_model(share_all_embeddings=tied, share_decoder_embeddings=tied)
    src, tgt = tokens([6, 3, 5], seed=11), tokens([5, 7, 2], bos=True, seed=12)
    with torch.no_grad():
        got, want = model(src, tgt), _by_hand(model, src, tgt)
    real = tgt.ne(PAD_ID)
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-4)
    # FixNorm: the input embeddings have length sqrt(d) whatever the table's rows
    with torch.no_grad():
        model.src_embed.weight.mul_(7.0)
    e = model._embed(model.src_embed, src[:1, :4]) - sinusoids(4, D)
    torch.testing.assert_close(e.norm(dim=-1), torch.full((1, 4), math.sqrt(D)), rtol=0, atol=1e-4)


def test_scale_cached_decoding_equals_full_forward_through_reorders():
    model = _scale_model()
    src = tokens([6, 3], seed=5)
    g = torch.Generator().manual_seed(6)
    cache = model.init_cache(model.encode(src))
    rows, hist = torch.arange(2), torch.full((2, 1), BOS_ID)
    reorders = {
        3: torch.arange(2).repeat_interleave(3),
        6: torch.tensor([2, 0, 1, 4, 5, 3]),
        9: torch.tensor([0, 2, 3, 5]),
    }
    for step in range(12):
        if step in reorders:
            cache.reorder(reorders[step])
            rows, hist = rows[reorders[step]], hist[reorders[step]]
        else:
            hist[:, -1] = torch.randint(4, V, (hist.size(0),), generator=g) if step else BOS_ID
        torch.testing.assert_close(
            model.decode_step(hist[:, -1], cache), model(src[rows], hist)[:, -1], rtol=0, atol=1e-5
        )
        hist = torch.cat([hist, torch.randint(4, V, (hist.size(0), 1), generator=g)], dim=1)


def test_cast_weights_keeps_scalenorm_in_float32():
    model = tiny_model(norm="scale").cast_weights(torch.bfloat16)
    assert all(m.g.dtype == torch.float32 for m in model.modules() if isinstance(m, ScaleNorm))
    assert model.encoder[0].ffn.fc1.weight.dtype == torch.bfloat16
    assert torch.isfinite(model(tokens([5]), tokens([4], bos=True))).all()


@pytest.fixture(scope="module")
def scale_run(corpus_slice, spm_model, tmp_path_factory):
    """A tiny norm=scale model trained 40 updates on the corpus slice through `train()`; per-update loss per token."""
    from transformer_mt.training import train

    out = tmp_path_factory.mktemp("scale_run") / "run"
    cfg = run_config(
        corpus_slice,
        spm_model,
        out,
        "model.norm=scale",
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
        "data.max_len=60",
    )
    losses = []
    result = train(cfg, on_update=lambda update, stats: losses.append(stats.loss / stats.tokens))
    assert result.progress.update == 40, result.stop_reason
    return out, losses


def test_scale_model_trains_and_decodes(scale_run, corpus_slice):
    from transformer_mt.decoding import Translator

    out, losses = scale_run
    assert all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, (first, last)  # label-smoothed loss per token: ~7.4 at the start, ~5.4 after 40 updates
    tr = Translator.from_checkpoint(out / "checkpoint_last.pt", device="cpu")
    assert tr.cfg.model.norm == "scale"
    lines = head(corpus_slice["val.en"], 4)
    for beam in (1, 3):
        hyps = tr.translate_batch(lines, beam=beam, lenpen=0.6).hypotheses
        assert len(hyps) == 4 and all(nb[0][1].strip() for nb in hyps)  # one non-empty German line per input


def test_scale_model_exports_to_ctranslate2_as_rmsnorm(scale_run, corpus_slice, tmp_path):
    """CTranslate2 has no ScaleNorm but has RMSNorm: g x / ||x|| = (g / sqrt(d)) x / rms(x), so the export writes
    RMSNorm gains g / sqrt(d) and the FixNorm-normalised embedding rows; CTranslate2's log-probabilities of reference
    translations then equal tmt's teacher-forced ones."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformer_mt.data import source_tensor
    from transformer_mt.decoding import Translator
    from transformer_mt.export import export

    run_dir, _ = scale_run
    out = export(run_dir / "checkpoint_last.pt", tmp_path / "ct2")
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["layer_norm_epsilon"] < 1e-8
    tr = Translator.from_checkpoint(run_dir / "checkpoint_last.pt", device="cpu")
    src_lines, tgt_lines = head(corpus_slice["val.en"], 8), head(corpus_slice["val.de"], 8)
    src_pieces, tgt_pieces = tr.src_tok.encode_pieces(src_lines), tr.tgt_tok.encode_pieces(tgt_lines)
    ct = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    for sp, tp, res in zip(src_pieces, tgt_pieces, ct.score_batch(src_pieces, tgt_pieces)):
        tgt = tr.tgt_tok.sp.piece_to_id(tp)
        src = source_tensor([tr.src_tok.sp.piece_to_id(sp)])
        with torch.inference_mode():
            model = tr.model
            assert isinstance(model, Transformer)
            lprobs = torch.log_softmax(model.decode(torch.tensor([[BOS_ID] + tgt]), model.encode(src)), dim=-1)[0]
        ours = lprobs[torch.arange(len(tgt) + 1), torch.tensor(tgt + [EOS_ID])]
        assert torch.tensor(res.log_probs) == pytest.approx(ours, abs=1e-4)
