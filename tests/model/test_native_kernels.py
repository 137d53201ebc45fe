"""The C++ kernels of a CPU training step (``transformer_mt.model.ops.cpu.native``) compute what the torch ops they
replace compute, values and gradients:

- the attention over few keys (``tmt::short_attention``) against the spelled-out product, in float64;
- the residual dropout-and-add against ``x + dropout(y)``, bit for bit (the same random words);
- ScaleNorm against its formula under autograd, in float64;
- the fused loss's softmax rows against the torch passes they replace, and the loss that takes its gradient in the
  forward against the one that keeps the softmax for the backward;
- the dropout masks' random words against torch's ``random_``, bit for bit, with the generator left in the same state;
- a whole training step on real Multi30k pairs with the kernels on and off: the loss and every parameter's gradient
  (tests/model/test_ops.py compares the cpu backend with the reference backend).

Where the kernels cannot be built, training falls back to the torch ops and says so in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import head, tiny_model
from transformer_mt.data import collate
from transformer_mt.model import TeacherForcedLoss, fixnorm
from transformer_mt.model.ops.cpu import CpuOps, fused_loss, native
from transformer_mt.model.ops.cpu.attention import short_attention
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.text import Tokenizer

kernels = CpuOps()  # the cpu backend, whose kernels these are

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        not native.available(), reason="the C++ kernels could not be built here (a C++ compiler and ninja are needed)"
    ),
]


class _CountTmtOps(TorchDispatchMode):
    """Counts the calls of each torch.ops.tmt operator while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("tmt."):
            key = name.split(".")[1]
            self.calls[key] = self.calls.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def kernels_off(monkeypatch):
    """Call to make every caller take its torch-op path, as where the kernels cannot be built."""
    return lambda: monkeypatch.setattr(native, "_loaded", [False])


def _attention_reference(q, k, v, allowed, causal, scale):
    """q (B, T, H, Dk), k (B, K, H, Dk), v (B, K, H, Dv) -> (B, T, H * Dv), spelled out in torch ops."""
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(q.size(1), k.size(1), dtype=torch.bool).tril(), float("-inf"))
    if allowed is not None:
        scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    return out.reshape(q.size(0), q.size(1), -1)


@pytest.mark.parametrize(
    ("queries", "keys", "dk", "dv", "causal", "padded"),
    [
        (9, 9, 16, 16, True, False),  # decoder self-attention: causal, no mask
        (13, 13, 32, 32, False, True),  # encoder self-attention with key padding
        (
            7,
            17,
            16,
            48,
            False,
            True,
        ),  # cross-attention: other lengths, value size unlike the key size, a partial key block
        (5, 64, 64, 64, False, True),  # the most keys the kernel takes, the reference model's head size
        (33, 33, 32, 32, True, False),  # query rows past a multiple of four, keys past two blocks
        (4, 1, 16, 16, False, False),  # one key
    ],
)
def test_short_attention_equals_the_spelled_out_product(queries, keys, dk, dv, causal, padded):
    gen = torch.Generator().manual_seed(queries * 100 + keys)
    b, h = 3, 2
    width = h * (dk + dk + dv)  # q, k and v as views of one fused projection, as the model makes them
    fused_q = torch.randn(b, queries, width, generator=gen)
    fused_kv = fused_q if queries == keys else torch.randn(b, keys, width, generator=gen)
    allowed = None
    if padded:
        allowed = torch.ones(b, keys, dtype=torch.bool)
        allowed[1, keys // 2 :] = False  # a padded sentence
        allowed[2, 1:] = False  # a sentence that keeps one key
    grad = torch.randn(b, queries, h * dv, generator=gen)
    scale = dk**-0.5

    def views(fq, fkv):
        q = fq[..., : h * dk].view(b, queries, h, dk)
        k = fkv[..., h * dk : 2 * h * dk].view(b, keys, h, dk)
        v = fkv[..., 2 * h * dk :].view(b, keys, h, dv)
        return q, k, v

    results = []
    for dtype in (torch.float32, torch.float64):  # the kernel in float32, the reference in float64
        fq = fused_q.to(dtype, copy=True).requires_grad_()
        fkv = fq if fused_kv is fused_q else fused_kv.to(dtype, copy=True).requires_grad_()
        q, k, v = views(fq, fkv)
        out = (
            short_attention(q, k, v, allowed, causal=causal, scale=scale)
            if dtype == torch.float32
            else _attention_reference(q, k, v, allowed, causal, scale)
        )
        out.backward(grad.to(dtype))
        results.append((out.detach(), fq.grad, None if fkv is fq else fkv.grad))
    for ours, exact in zip(results[0], results[1], strict=True):
        if fused_kv is fused_q and exact is None:  # self-attention: q, k and v share one tensor and its gradient
            continue
        assert ours is not None and exact is not None
        torch.testing.assert_close(ours, exact.float(), rtol=1e-5, atol=2e-6 * float(exact.abs().max()))


def test_short_attention_refuses_what_it_cannot_compute():
    q = torch.randn(2, 3, 2, 16)
    with pytest.raises(RuntimeError, match="multiples of 16"):
        short_attention(q[..., :8], q[..., :8], q[..., :8], None, causal=False, scale=1.0)
    long = torch.randn(2, 65, 2, 16)
    with pytest.raises(RuntimeError, match="1 to 64 keys"):
        short_attention(q, long, long, None, causal=False, scale=1.0)


def test_residual_dropout_gives_the_bits_of_x_plus_dropout():
    gen = torch.Generator().manual_seed(3)
    x, y, grad = (torch.randn(5, 11, 64, generator=gen) for _ in range(3))
    results = []
    for fused in (True, False):
        xx, yy = x.clone().requires_grad_(), y.clone().requires_grad_()
        torch.manual_seed(17)  # the same random words for both
        with _CountTmtOps() as counter:
            out = kernels.residual_dropout(xx, yy, 0.3, True) if fused else xx + kernels.dropout(yy, 0.3, True)
            out.backward(grad)
        assert ("dropout_add" in counter.calls) == fused
        results.append((out.detach(), xx.grad, yy.grad))
    for ours, plain in zip(results[0], results[1], strict=True):
        assert ours is not None and plain is not None and torch.equal(ours, plain)
    y_grad = results[0][2]
    assert y_grad is not None
    dropped = (y_grad == 0).float().mean().item()
    assert 0.25 < dropped < 0.35  # the mask drops about p of the elements


def test_residual_dropout_is_the_plain_add_where_it_does_not_apply():
    x, y = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    assert torch.equal(kernels.residual_dropout(x, y, 0.3, False), x + y)  # eval: no dropout
    assert torch.equal(kernels.residual_dropout(x, y, 0.0, True), x + y)
    with _CountTmtOps() as counter:  # the reference backend: the benchmark's plain-ops rows
        ReferenceOps().residual_dropout(x, y, 0.3, True)
    assert not counter.calls


def test_native_scale_norm_equals_the_formula_in_float64():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 128, generator=gen)
    x[3] = 0.0  # a zero row: below eps the norm is the constant eps
    x[5] *= 1e-9  # a tiny row, also below eps
    dy = torch.randn(40, 128, generator=gen)
    results = []
    for dtype in (torch.float32, torch.float64):
        xx = x.to(dtype, copy=True).requires_grad_()
        g = torch.tensor(11.3, dtype=dtype, requires_grad=True)
        with _CountTmtOps() as counter:
            y = (
                kernels.scale_norm(xx, g, 1e-5)
                if dtype == torch.float32
                else xx * (g / xx.norm(dim=-1, keepdim=True).clamp(min=1e-5))
            )
            y.backward(dy.to(dtype))
        assert ("scale_norm" in counter.calls) == (dtype == torch.float32)
        results.append((y.detach(), xx.grad, g.grad))
    for ours, exact in zip(results[0], results[1], strict=True):
        assert ours is not None and exact is not None
        torch.testing.assert_close(ours, exact.float(), rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


def test_fixnorm_in_a_training_step_is_f_normalize():
    """The C++ ScaleNorm with the gain fixed at 1 against F.normalize, values and gradients, with a zero row (PAD's
    embedding: 0 forward, dy / eps backward in both)."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(6, 9, 128, generator=gen)
    x[0, 0] = 0.0
    dy = torch.randn(6, 9, 128, generator=gen)
    results = []
    for fused in (True, False):
        xx = x.clone().requires_grad_()
        with _CountTmtOps() as counter:
            y = fixnorm(xx, ops=kernels) if fused else torch.nn.functional.normalize(xx, dim=-1)
            y.backward(dy)
        assert ("scale_norm" in counter.calls) == fused
        results.append((y.detach(), xx.grad))
    for ours, plain in zip(*results, strict=True):
        torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-6 * float(plain.abs().max()))
    assert not results[0][0][0, 0].any()
    with torch.no_grad():
        assert torch.equal(fixnorm(x, ops=kernels), torch.nn.functional.normalize(x, dim=-1))  # decoding: F.normalize


@pytest.mark.parametrize("vocab", [6898, 37])  # the recipe's kept target pieces; a row shorter than a vector and a tail
def test_softmax_rows_equal_the_torch_passes(vocab):
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(19, vocab, generator=gen) * 6
    target = torch.randint(0, vocab, (19,), generator=gen)
    probs = x.clone()
    lse, tgt, total = torch.ops.tmt.softmax_rows_(probs, target)
    exact = x.double()
    torch.testing.assert_close(lse, exact.logsumexp(1).float(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(probs, exact.softmax(1).float(), rtol=1e-5, atol=1e-8)
    assert torch.equal(tgt, x.gather(1, target[:, None]).squeeze(1))
    torch.testing.assert_close(total, exact.sum(1).float(), rtol=1e-5, atol=1e-3)
    row_w = torch.rand(19, generator=gen)
    row_w[4] = 0.0  # a padded row
    eps_i, on_target = 0.1 / (vocab - 1), -0.9
    plain = probs.clone().sub_(eps_i)  # the backward's torch ops, in their order
    plain.scatter_add_(1, target[:, None], plain.new_full((19, 1), on_target))
    plain.mul_(row_w[:, None])
    torch.ops.tmt.softmax_rows_backward_(probs, target, row_w, eps_i, on_target)
    assert torch.equal(probs, plain)


def test_softmax_rows_grad_is_the_softmax_then_its_backward():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(23, 6898, generator=gen) * 6
    target = torch.randint(0, 6898, (23,), generator=gen)
    row_w = torch.rand(23, generator=gen)
    row_w[7] = 0.0
    eps_i, on_target = 0.1 / 6897, -0.9
    two_steps, one_pass = x.clone(), x.clone()
    sums = torch.ops.tmt.softmax_rows_(two_steps, target)
    torch.ops.tmt.softmax_rows_backward_(two_steps, target, row_w, eps_i, on_target)
    for ours, theirs in zip(
        torch.ops.tmt.softmax_rows_grad_(one_pass, target, row_w, eps_i, on_target), sums, strict=True
    ):
        assert torch.equal(ours, theirs)
    torch.testing.assert_close(one_pass, two_steps, rtol=1e-6, atol=1e-9)  # p * (1 / z) - eps_i may round as one FMA
    assert not one_pass[7].any()


@pytest.mark.parametrize("epsilon", [0.1, 0.0])
def test_the_loss_with_its_gradient_in_the_forward_equals_the_one_that_keeps_the_softmax(epsilon, monkeypatch):
    """Several chunks, a last short one, padded rows: the same loss sums and gradients; without grad
    mode (validation) the plain fused loss runs, and no gradient is computed."""
    monkeypatch.setattr(fused_loss, "_CHUNK_BYTES", 64 * 4 * 1000)  # 64 rows of 1,000 logits per chunk
    gen = torch.Generator().manual_seed(5)
    h = torch.randn(150, 33, generator=gen).requires_grad_()
    weight = (torch.randn(1000, 33, generator=gen) * 0.2).requires_grad_()
    target = torch.randint(0, 1000, (150,), generator=gen)
    target[[0, 64, 149]] = 1  # padding (ignore_index 1), in three chunks
    results = []
    for gradient_in_forward in (True, False):
        monkeypatch.setattr(fused_loss, "_gradient_in_forward", lambda *_, on=gradient_in_forward: on)
        h.grad = weight.grad = None
        with _CountTmtOps() as counter:
            loss, nll = fused_loss.fused_projected_label_smoothed_loss(
                h, weight, target, epsilon=epsilon, ignore_index=1
            )
            (loss * 0.37).backward()
        assert counter.calls.get("softmax_rows_grad_", 0) == (3 if gradient_in_forward else 0)
        results.append((loss.detach(), nll, h.grad, weight.grad))
    (loss, nll, gh, gw), (plain_loss, plain_nll, plain_gh, plain_gw) = results
    assert torch.equal(loss, plain_loss) and torch.equal(nll, plain_nll)
    assert gh is not None and gw is not None and plain_gh is not None and plain_gw is not None
    assert not gh[[0, 64, 149]].any()
    torch.testing.assert_close(gh, plain_gh, rtol=1e-5, atol=1e-6 * float(plain_gh.abs().max()))
    torch.testing.assert_close(gw, plain_gw, rtol=1e-5, atol=1e-6 * float(plain_gw.abs().max()))
    monkeypatch.undo()
    with torch.no_grad(), _CountTmtOps() as counter:
        assert torch.equal(
            fused_loss.fused_projected_label_smoothed_loss(h, weight, target, epsilon=epsilon, ignore_index=1)[0], loss
        )
    assert "softmax_rows_grad_" not in counter.calls and counter.calls["softmax_rows_"] >= 1


@pytest.mark.parametrize("drawn_before", [0, 1, 623, 624, 1247])  # 32-bit draws: odd counts split a 64-bit word
def test_random_words_are_torchs_random_words_and_leave_the_generator_where_torch_does(drawn_before):
    for count in (0, 1, 311, 312, 313, 100_003):
        torch.manual_seed(9)
        torch.rand(drawn_before)  # float32: one 32-bit mt19937 draw each
        theirs = torch.empty(count, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        after_theirs = torch.rand(5)
        torch.manual_seed(9)
        torch.rand(drawn_before)
        ours = torch.ops.tmt.random_words(count)
        assert torch.equal(ours, theirs), (drawn_before, count)
        assert torch.equal(torch.rand(5), after_theirs)


def _real_batch(corpus_slice, spm_model, n: int = 24):
    tok = Tokenizer(spm_model)
    src = tok.encode(head(corpus_slice["train.en"], n, skip=300))
    tgt = tok.encode(head(corpus_slice["train.de"], n, skip=300))
    return tok.vocab_size, collate(list(zip(src, tgt, strict=True)))


@pytest.mark.parametrize("norm", ["post", "pre", "scale"])
def test_a_training_step_with_the_kernels_equals_the_torch_ops_on_real_pairs(
    norm, corpus_slice, spm_model, kernels_off
):
    """Dropout 0.3, head size 16, the fused loss: every kernel runs; the same step with the kernels off (the torch ops
    of an unbuilt install) gives the same loss and gradients, with the same random numbers drawn."""
    vocab, batch = _real_batch(corpus_slice, spm_model)
    assert batch.src_padded
    model = tiny_model(vocab, d_model=64, heads=4, d_ff=128, dropout=0.3, norm=norm, share_all_embeddings=True).train()

    def step() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(23)
        loss, _, _ = TeacherForcedLoss(model, label_smoothing=0.1)(
            batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded
        )
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    with _CountTmtOps() as counter:
        ours = step()
    layers = 2 + 2 * 2  # encoder self, decoder self and cross
    assert counter.calls["short_attention"] == counter.calls["short_attention_backward"] == layers
    assert counter.calls["dropout_add"] == counter.calls["dropout_backward"] == 2 * 2 + 3 * 2  # every sublayer
    assert counter.calls["softmax_rows_grad_"] >= 1  # the loss's gradient taken in its forward
    assert counter.calls["random_words"] >= counter.calls["dropout_add"]
    assert ("scale_norm" in counter.calls) == (norm == "scale")
    kernels_off()
    with _CountTmtOps() as counter:
        plain = step()
    assert not counter.calls
    torch.testing.assert_close(ours[0], plain[0], rtol=1e-5, atol=1e-5)
    assert ours[1].keys() == plain[1].keys()
    for name, grad in ours[1].items():
        scale = float(grad.abs().max())  # float32 sums in another order: agreement relative to the gradient's size
        torch.testing.assert_close(
            grad, plain[1][name], rtol=1e-4, atol=1e-5 * scale, msg=f"{name}: the gradients differ"
        )


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


@pytest.mark.slow
def test_without_a_compiler_training_keeps_the_torch_ops_and_says_so_in_one_line(tmp_path):
    code = "from transformer_mt.model.ops.cpu import native; print(native.available())"
    failed = _python(code, CXX="false", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert failed.returncode == 0 and failed.stdout.strip() == "False"
    notes = [line for line in failed.stderr.splitlines() if line.startswith("tmt: note:")]
    assert len(notes) == 1 and "could not be built" in notes[0] and "Traceback" not in failed.stderr
    skipped = _python(code, TMT_NATIVE_KERNELS="0", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert skipped.stdout.strip() == "False" and skipped.stderr == ""
