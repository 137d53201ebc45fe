"""Label-smoothed loss against a per-token loop, padding invariance, the fused projection loss and the CPU kernels
(the cpu backend against the reference backend)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import head, tiny_model
from transformer_mt.data import collate
from transformer_mt.model import (
    TeacherForcedLoss,
    label_smoothed_nll_loss,
    perplexity,
    projected_label_smoothed_loss,
)
from transformer_mt.model.ops.cpu import CpuOps, fused_loss
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.text import PAD_ID, Tokenizer


def naive_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float, int]:
    """Loop over tokens with an explicit smoothed target: 1 - eps on the reference, eps / (V - 1) elsewhere."""
    vocab = logits.size(-1)
    loss = nll = 0.0
    count = 0
    for row, y in zip(logits.reshape(-1, vocab).double(), target.reshape(-1).tolist()):
        if y == PAD_ID:
            continue
        logp = row - torch.logsumexp(row, 0)
        q = torch.full((vocab,), eps / (vocab - 1), dtype=torch.float64)
        q[y] = 1.0 - eps
        loss += float(-(q * logp).sum())
        nll += float(-logp[y])
        count += 1
    return loss, nll, count


@pytest.fixture
def logits_and_target():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    target = torch.randint(4, 11, (3, 5), generator=g)
    target[0, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    return logits, target


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_loss_matches_a_per_token_loop(logits_and_target, eps):
    logits, target = logits_and_target
    loss, nll, n = label_smoothed_nll_loss(logits, target, epsilon=eps)
    want_loss, want_nll, want_n = naive_smoothed_loss(logits, target, eps)
    assert n == want_n == 15 - 2 - 4
    assert loss.dtype == nll.dtype == torch.float32
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert nll.item() == pytest.approx(want_nll, rel=1e-6)


def test_gradient_is_softmax_minus_smoothed_target_and_zero_on_padding(logits_and_target):
    logits, target = logits_and_target
    logits = logits.clone().requires_grad_(True)
    eps, vocab = 0.1, logits.size(-1)
    label_smoothed_nll_loss(logits, target, epsilon=eps)[0].backward()
    q = torch.full(logits.shape, eps / (vocab - 1)).scatter(-1, target.unsqueeze(-1), 1.0 - eps)
    want = (logits.detach().softmax(-1) - q) * (target != PAD_ID).unsqueeze(-1)
    torch.testing.assert_close(logits.grad, want, atol=1e-6, rtol=1e-5)


def test_epsilon_zero_is_cross_entropy_and_bf16_is_computed_in_float32(logits_and_target):
    logits, target = logits_and_target
    loss, nll, n = label_smoothed_nll_loss(logits, target, epsilon=0.0)
    ce = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD_ID, reduction="sum")
    assert loss.item() == pytest.approx(ce.item(), rel=1e-6) and nll.item() == pytest.approx(ce.item(), rel=1e-6)
    half = logits.bfloat16()
    loss16, nll16, _ = label_smoothed_nll_loss(half, target, epsilon=0.1)
    loss32, nll32, _ = label_smoothed_nll_loss(half.float(), target, epsilon=0.1)
    assert loss16.dtype == torch.float32 and loss16.item() == pytest.approx(loss32.item(), rel=1e-6)
    # another ignore_index, e.g. -100 as in torch
    other = target.masked_fill(target == PAD_ID, -100)
    assert label_smoothed_nll_loss(logits, other, epsilon=0.1, ignore_index=-100)[0].item() == pytest.approx(
        label_smoothed_nll_loss(logits, target, epsilon=0.1)[0].item(), rel=1e-6
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_projection_loss_equals_logits_then_loss_in_value_and_gradients(monkeypatch, eps):
    """Against the per-token loop (values) and autograd through h @ W.T + label_smoothed_nll_loss
    (gradients of h and W), in chunks of 2 rows, with padding labels on some rows."""
    monkeypatch.setattr(fused_loss, "_CHUNK_BYTES", 2 * 4 * 13)  # 2 rows of 13 float32 per chunk
    g = torch.Generator().manual_seed(1)
    h = (torch.randn(7, 6, generator=g) * 2).requires_grad_(True)
    w = torch.randn(13, 6, generator=g).requires_grad_(True)
    target = torch.randint(4, 13, (7,), generator=g)
    target[[2, 5]] = PAD_ID
    loss, nll, n = projected_label_smoothed_loss(h, w, target, epsilon=eps, ops=CpuOps())
    want_loss, want_nll, want_n = naive_smoothed_loss((h @ w.t()).detach(), target, eps)
    assert n == want_n == 5
    assert loss.item() == pytest.approx(want_loss, rel=1e-5) and nll.item() == pytest.approx(want_nll, rel=1e-5)
    (loss * 0.5).backward()
    h2, w2 = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    (label_smoothed_nll_loss(h2 @ w2.t(), target, epsilon=eps)[0] * 0.5).backward()
    torch.testing.assert_close(h.grad, h2.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad, w2.grad, atol=1e-5, rtol=1e-4)
    assert h.grad is not None and h.grad[[2, 5]].abs().max() == 0  # padding rows get no gradient


def test_teacher_forced_loss_module_equals_the_logits_path(spm_model, multi30k):
    tok = Tokenizer(spm_model)
    model = tiny_model(tok.vocab_size, max_positions=1024).train()  # real sentences: room for any length
    pairs = list(zip(tok.encode(head(multi30k / "val.en", 6)), tok.encode(head(multi30k / "val.de", 6))))
    batch = collate(pairs)
    keep = batch.tgt_out.ne(PAD_ID)
    torch.manual_seed(3)
    objective = TeacherForcedLoss(model, label_smoothing=0.1)
    params = list(model.parameters())
    assert len(list(objective.parameters())) == len(params) and all(
        a is b for a, b in zip(objective.parameters(), params)
    )  # DDP reduces these
    assert list(objective.state_dict()) == [
        "model." + k for k in model.state_dict()
    ]  # checkpoints save the model, not this
    fused = objective(batch.src, batch.tgt_in, batch.tgt_out)
    fused[0].backward()
    fused_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(3)  # the same dropout masks
    plain = label_smoothed_nll_loss(model(batch.src, batch.tgt_in, keep=keep), batch.tgt_out[keep], epsilon=0.1)
    plain[0].backward()
    assert fused[2] == plain[2] == batch.ntokens
    assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-5)
    for a, p in zip(fused_grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, atol=1e-5, rtol=1e-4)


def test_cpu_dropout_rate_scale_gradient_and_seed():
    dropout = CpuOps().dropout
    x = torch.ones(1000, 1000, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.3, True)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.003  # 1e6 draws: 3 sigma ~ 0.0014
    p_eff = round(0.3 * 65536) / 65536
    assert torch.all(y[kept] == 1 / (1 - p_eff))  # inverted dropout, unbiased for the rounded rate
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d y / d x = mask * scale
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.3, True), y)  # the torch generator's seed decides the mask
    assert dropout(x, 0.3, False) is x and dropout(x, 0.0, True) is x
    rows = dropout(torch.ones(4, 8192), 0.5, True) != 0  # no lane of the random words is biased
    assert all(abs(r.float().mean().item() - 0.5) < 0.05 for r in rows.view(4, -1, 4).unbind(-1))


def test_the_reference_backend_is_the_plain_equivalents_and_leaves_no_switch_behind():
    """The reference backend: dropout is F.dropout itself (the same mask for the same seed) and the projected loss
    is logits then label_smoothed_nll_loss, bit for bit; the cpu backend used after it, and it after the cpu one,
    each still compute their own (choosing one changes nothing for the other)."""
    x = torch.randn(64, 32)
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(9, 8, generator=g), torch.randn(11, 8, generator=g)
    target = torch.randint(4, 11, (9,), generator=g)
    target[3] = PAD_ID
    reference, cpu = ReferenceOps(), CpuOps()
    torch.manual_seed(5)
    ours = reference.dropout(x, 0.3, True)
    torch.manual_seed(5)
    assert torch.equal(ours, F.dropout(x, 0.3, True))
    plain = projected_label_smoothed_loss(h, w, target, epsilon=0.1, ops=reference)
    want = label_smoothed_nll_loss(h @ w.t(), target, epsilon=0.1)
    assert torch.equal(plain[0], want[0]) and torch.equal(plain[1], want[1]) and plain[2] == want[2] == 8
    torch.manual_seed(5)
    assert not torch.equal(cpu.dropout(x, 0.3, True), ours)  # the 64-bit-word kernel draws another mask
    fused = projected_label_smoothed_loss(h, w, target, epsilon=0.1, ops=cpu)
    assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-5) and fused[2] == 8
    torch.manual_seed(5)
    assert torch.equal(reference.dropout(x, 0.3, True), ours)  # the reference backend again: F.dropout still
    again = projected_label_smoothed_loss(h, w, target, epsilon=0.1, ops=reference)
    assert torch.equal(again[0], want[0]) and torch.equal(again[1], want[1])


def test_perplexity_is_exp_of_nll_per_token():
    assert perplexity(20 * math.log(7.0), 20) == pytest.approx(7.0)
    assert perplexity(torch.tensor(0.0), 5) == 1.0
    assert perplexity(1e6, 1) == math.inf and math.isnan(perplexity(1.0, 0))


def test_padding_does_not_change_the_loss(spm_model, multi30k):
    tok = Tokenizer(spm_model)
    model = tiny_model(tok.vocab_size, max_positions=1024)  # real sentences: room for any length
    pairs = list(zip(tok.encode(head(multi30k / "val.en", 6)), tok.encode(head(multi30k / "val.de", 6))))
    with torch.no_grad():
        batch = collate(pairs)
        together = label_smoothed_nll_loss(model(batch.src, batch.tgt_in), batch.tgt_out, epsilon=0.1)
        alone = [
            label_smoothed_nll_loss(model(b.src, b.tgt_in), b.tgt_out, epsilon=0.1)
            for b in (collate([p]) for p in pairs)
        ]
        pad = lambda x, n: F.pad(x, (0, n), value=PAD_ID)  # noqa: E731 - extra PAD columns
        padded = label_smoothed_nll_loss(
            model(pad(batch.src, 7), pad(batch.tgt_in, 5)), pad(batch.tgt_out, 5), epsilon=0.1
        )
    assert together[2] == sum(a[2] for a in alone) == padded[2] == batch.ntokens
    assert together[0].item() == pytest.approx(sum(a[0].item() for a in alone), rel=1e-5)
    assert padded[0].item() == pytest.approx(together[0].item(), rel=1e-5)
    assert padded[1].item() == pytest.approx(together[1].item(), rel=1e-5)
    assert batch.src.eq(PAD_ID).any() and batch.tgt_out.eq(PAD_ID).any()  # the batch really had padding


def test_fused_loss_under_bfloat16_autocast_matches_the_plain_path():
    """Under bf16 autocast the fused kernel projects in bf16 (the cast weight kept from forward for backward)
    and takes the softmax in float32, as autocast's plain path does: same loss and gradients to bf16 precision."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = (0.3 * torch.randn(50, 16, generator=g)).requires_grad_()
    target = torch.randint(0, 50, (37,), generator=g)
    target[::7] = PAD_ID
    out: dict[bool, tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]] = {}
    for plain in (False, True):
        h.grad = w.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ops = ReferenceOps() if plain else CpuOps()
            loss, nll, n = projected_label_smoothed_loss(h, w, target, epsilon=0.1, ops=ops)
        loss.backward()
        assert h.grad is not None and w.grad is not None
        out[plain] = (loss.detach(), nll, n, h.grad.clone(), w.grad.clone())
    (loss, nll, n, gh, gw), (rloss, rnll, rn, rgh, rgw) = out[False], out[True]
    assert loss.dtype == torch.float32 and n == rn == int((target != PAD_ID).sum())
    torch.testing.assert_close(loss, rloss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(nll, rnll, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(gh, rgh, rtol=0.02, atol=2e-3)
    torch.testing.assert_close(gw, rgw, rtol=0.02, atol=2e-3)
