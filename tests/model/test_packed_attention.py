"""``ops.varlen_attention``: attention over packed sentences, against SDPA on each sentence alone, values and gradients;
the cuda backend's dispatch to flash attention's varlen kernel (its CPU-provable parts here, the kernel under
``-m cuda``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_mt.data.packing import segments
from transformer_mt.model.ops import cuda, varlen
from transformer_mt.model.ops.cpu import CpuOps
from transformer_mt.model.ops.cuda import CudaOps
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.model.ops.varlen import flash_varlen_applies

pytestmark = pytest.mark.usefixtures("one_thread")
H, D = 4, 16  # heads, head size (16: the cpu backend's C++ attention takes it)


def _packed(lengths: list[int], *, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), H, D, generator=g, dtype=dtype).to(device).requires_grad_()


def _per_sentence(q, k, v, q_lengths, k_lengths, *, causal: bool) -> torch.Tensor:
    """SDPA on each sentence alone, no mask needed: (Nq, H, Dv)."""
    outs = []
    for qs, ks, vs in zip(q.split(q_lengths), k.split(k_lengths), v.split(k_lengths), strict=True):
        qh, kh, vh = (x.transpose(0, 1)[None] for x in (qs, ks, vs))  # (n, H, D) -> (1, H, n, D)
        outs.append(F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)[0].transpose(0, 1))
    return torch.cat(outs)


def _varlen(ops, q, k, v, q_lengths, k_lengths, *, causal: bool, dropout_p: float = 0.0) -> torch.Tensor:
    cu_q, _, max_q = segments(torch.tensor(q_lengths).numpy())
    cu_k, _, max_k = segments(torch.tensor(k_lengths).numpy())
    cu_q, cu_k = cu_q.to(q.device), cu_k.to(q.device)
    return ops.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, dropout_p=dropout_p)


def _values_and_grads(fn, q, k, v) -> list[torch.Tensor]:
    out = fn(q, k, v)
    gen = torch.Generator().manual_seed(9)
    dy = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)  # the same numbers for every dtype
    grads = torch.autograd.grad(out, (q, k, v), dy)
    return [out.detach(), *grads]


CASES = {  # name: (query lengths, key lengths, causal)
    "self": ([3, 1, 7, 4], [3, 1, 7, 4], False),
    "causal": ([3, 1, 7, 4], [3, 1, 7, 4], True),
    "cross": ([3, 1, 7, 4], [5, 2, 1, 6], False),
    "one sentence": ([6], [6], True),
    "one-token sentences": ([1, 1, 1], [1, 1, 1], True),
    "one-token queries": ([1, 1, 1], [4, 2, 3], False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ops", [ReferenceOps(), CpuOps(), CudaOps()], ids=lambda o: o.name)
def test_varlen_attention_equals_sdpa_on_each_sentence_alone(case, ops):
    """Every backend's form on a CPU (the cpu backend's through its C++ attention where built, the cuda backend's
    falling back to the reference form off a GPU), values and the gradients of q, k and v."""
    q_lengths, k_lengths, causal = CASES[case]
    dtype = torch.float64 if type(ops) is ReferenceOps else torch.float32  # the others' kernels are float32's
    q = _packed(q_lengths, dtype=dtype, seed=1)
    k, v = _packed(k_lengths, dtype=dtype, seed=2), _packed(k_lengths, dtype=dtype, seed=3)
    ours = _values_and_grads(lambda q, k, v: _varlen(ops, q, k, v, q_lengths, k_lengths, causal=causal), q, k, v)
    plain = _values_and_grads(lambda q, k, v: _per_sentence(q, k, v, q_lengths, k_lengths, causal=causal), q, k, v)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"{case}: {name} differs")


def test_a_sentence_sees_only_itself_also_under_attention_dropout():
    """With dropout (the same generator state), changing one sentence's keys and values leaves every other
    sentence's output as it was, bit for bit."""
    lengths = [3, 5, 2]
    q, k, v = (_packed(lengths, dtype=torch.float32, seed=s).detach() for s in (1, 2, 3))
    k2, v2 = k.clone(), v.clone()
    k2[3:8] += 1.0  # sentence 1
    v2[3:8] -= 2.0
    outs = []
    for kk, vv in ((k, v), (k2, v2)):
        torch.manual_seed(5)
        outs.append(_varlen(ReferenceOps(), q, kk, vv, lengths, lengths, causal=False, dropout_p=0.3))
    assert torch.equal(outs[0][:3], outs[1][:3]) and torch.equal(outs[0][8:], outs[1][8:])
    assert not torch.equal(outs[0][3:8], outs[1][3:8])


def test_flash_varlen_is_chosen_only_where_its_kernel_applies():
    """The CPU-provable half of the cuda backend's dispatch: CPU tensors, float32 and attention dropout all keep the
    reference form."""
    q = torch.randn(5, H, D, dtype=torch.bfloat16)
    assert not flash_varlen_applies(q, q, q, dropout_p=0.0)  # not on CUDA
    meta = torch.empty(5, H, D, dtype=torch.bfloat16, device="meta")
    assert not flash_varlen_applies(meta, meta, meta, dropout_p=0.0)


def _fake_kernel(calls: list[dict]):
    """A stand-in for ``varlen_attn`` with its signature: per-sentence SDPA from the cumulative lengths."""

    def varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1)):
        calls.append({"cu_dtype": cu_seq_q.dtype, "window_size": window_size, "max": (max_q, max_k)})
        q_lengths, k_lengths = cu_seq_q.diff().tolist(), cu_seq_k.diff().tolist()
        return _per_sentence(q, k, v, q_lengths, k_lengths, causal=window_size == (-1, 0))

    return varlen_attn


@pytest.mark.parametrize("case", ["causal", "cross"])
def test_the_cuda_backend_hands_the_packed_layout_to_the_varlen_kernel(case, monkeypatch):
    """The dispatch and the arguments, proved on a CPU with a stand-in kernel: int32 cumulative lengths, the longest
    lengths, causal as window (-1, 0); the kernel's output comes back as it is."""
    calls: list[dict] = []
    monkeypatch.setattr(varlen, "varlen_attn", _fake_kernel(calls))
    monkeypatch.setattr(varlen, "CAUSAL_BY_WINDOW", True)
    monkeypatch.setattr(cuda, "flash_varlen_applies", lambda q, k, v, *, dropout_p: True)
    q_lengths, k_lengths, causal = CASES[case]
    q = _packed(q_lengths, dtype=torch.float32, seed=1)
    k, v = _packed(k_lengths, dtype=torch.float32, seed=2), _packed(k_lengths, dtype=torch.float32, seed=3)
    out = _varlen(CudaOps(), q, k, v, q_lengths, k_lengths, causal=causal)
    assert calls == [
        {"cu_dtype": torch.int32, "window_size": (-1, 0) if causal else (-1, -1), "max": (7, 7 if causal else 6)}
    ]
    torch.testing.assert_close(out, _per_sentence(q, k, v, q_lengths, k_lengths, causal=causal))


def test_flash_capability_is_asked_once_and_traced_as_a_constant(monkeypatch):
    """A compiled layer takes the machine's capability as a constant: no graph break, no call per step."""
    asked: list[int] = []

    def capability(index: int) -> tuple[int, int]:
        asked.append(index)
        return (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(varlen, "_capable", {})
    compiled = torch.compile(lambda x: x * 2 if varlen.flash_capable(0) else x, backend="eager", fullgraph=True)
    assert compiled(torch.ones(3)).tolist() == [2.0, 2.0, 2.0] and compiled(torch.ones(3)).tolist() == [2.0] * 3
    assert asked == [0]


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["self", "causal", "cross", "one-token sentences"])
def test_flash_varlen_attention_equals_the_reference_form_on_a_gpu(case):
    """The cuda backend's flash varlen kernel in bfloat16 against the reference form (padded SDPA) in float32 on the
    same bf16 inputs: values and gradients within bf16 rounding."""
    q_lengths, k_lengths, causal = CASES[case]
    q = _packed(q_lengths, dtype=torch.bfloat16, seed=1, device="cuda")
    k = _packed(k_lengths, dtype=torch.bfloat16, seed=2, device="cuda")
    v = _packed(k_lengths, dtype=torch.bfloat16, seed=3, device="cuda")
    assert flash_varlen_applies(q, k, v, dropout_p=0.0)
    flash = _values_and_grads(lambda q, k, v: _varlen(CudaOps(), q, k, v, q_lengths, k_lengths, causal=causal), q, k, v)
    as32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    reference = _values_and_grads(
        lambda q, k, v: _varlen(ReferenceOps(), q, k, v, q_lengths, k_lengths, causal=causal), *as32
    )
    for name, a, b in zip(("out", "dq", "dk", "dv"), flash, reference, strict=True):
        torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2, msg=f"{case}: {name} differs")
    assert not flash_varlen_applies(q.float(), k.float(), v.float(), dropout_p=0.0)  # float32: the reference form
    assert not flash_varlen_applies(q, k, v, dropout_p=0.1)  # the kernel has no dropout
