"""The ops backends: the same model computes the same numbers on each (forward, decoding steps, the training loss
and every gradient, against the reference backend), choosing one changes no process state, and the user's choice
(``train.ops``, ``load(..., ops=...)``) is the one a model computes with."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import head, run_config, tiny_model, tokens
from transformer_mt.config import ConfigError
from transformer_mt.data import collate
from transformer_mt.model import OPS_CHOICES, TeacherForcedLoss, Transformer, choose_ops
from transformer_mt.model.ops.cpu import CpuOps
from transformer_mt.model.ops.cuda import CudaOps
from transformer_mt.model.ops.reference import ReferenceOps
from transformer_mt.text import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {"cpu": CpuOps, "cuda": CudaOps}  # the CUDA backend's paths run on CPU tensors too (its SDPA unpinned there)


def _real_batch(corpus_slice, spm_model, n: int = 16):
    tok = Tokenizer(spm_model)
    src = tok.encode(head(corpus_slice["train.en"], n, skip=500))
    tgt = tok.encode(head(corpus_slice["train.de"], n, skip=500))
    return tok.vocab_size, collate(list(zip(src, tgt, strict=True)))


def _computed(model: Transformer, batch) -> dict[str, torch.Tensor]:
    """What a model computes on a batch: a training step's loss, nll and gradients (train mode), the eval logits,
    and the logits of three decoding steps over two beams per sentence."""
    out: dict[str, torch.Tensor] = {}
    model.train().zero_grad(set_to_none=True)
    loss, nll, _ = TeacherForcedLoss(model, label_smoothing=0.1)(
        batch.src, batch.tgt_in, batch.tgt_out, batch.labels, src_padded=batch.src_padded
    )
    loss.backward()
    out.update(loss=loss.detach(), nll=nll.detach())
    out.update({f"grad {name}": p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    model.eval()
    with torch.inference_mode():
        enc = model.encode(batch.src)
        out["logits"] = model.decode(batch.tgt_in, enc)
        cache = model.init_cache(enc)
        b = batch.src.size(0)
        cache.reorder(torch.arange(b).repeat_interleave(2), group=2)  # two beams per sentence share the source
        for step in range(3):
            out[f"step {step}"] = model.decode_step(batch.tgt_in[:, step].repeat_interleave(2), cache)
    return out


def _assert_agree(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        scale = float(value.abs().max())  # float32 sums in another order: agreement relative to the tensor's size
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5 * max(scale, 1.0), msg=key)


@pytest.mark.parametrize("norm", ["post", "scale"])
@pytest.mark.parametrize("fast", sorted(FAST))
def test_each_backend_computes_what_the_reference_computes(fast, norm, corpus_slice, spm_model):
    """Dropout 0 (the backends draw their masks differently), a padded source, decoding steps over 32 rows (the
    spelled-out step) and over fewer: loss, gradients, logits and step logits agree with the reference's."""
    vocab, batch = _real_batch(corpus_slice, spm_model)
    assert batch.src_padded
    model = tiny_model(vocab, d_model=64, heads=4, d_ff=128, norm=norm, share_all_embeddings=True)
    want = _computed(model.use_ops(ReferenceOps()), batch)
    _assert_agree(_computed(model.use_ops(FAST[fast]()), batch), want)
    small = _real_batch(corpus_slice, spm_model, n=4)[1]  # 8 rows: every backend's SDPA step
    _assert_agree(_computed(model.use_ops(FAST[fast]()), small), _computed(model.use_ops(ReferenceOps()), small))


def test_every_submodule_computes_with_the_models_backend():
    model = tiny_model(norm="scale")
    assert isinstance(model.ops, CpuOps)  # auto, where a model is built: the CPU's
    users = [m for m in model.modules() if "ops" in vars(m)]
    assert len(users) > 10 and all(m.ops is model.ops for m in users)
    reference = ReferenceOps()
    assert model.use_ops(reference) is model and all(m.ops is reference for m in users)


def test_two_models_on_two_backends_compute_their_own_numbers_in_any_order():
    """A reference model and a cpu model with the same weights in one process: each gives, in any interleaving,
    exactly what it gives alone (dropout on: the backends draw different masks from the same seed)."""
    reference = tiny_model(dropout=0.3).use_ops(choose_ops("reference")).train()
    cpu = tiny_model(dropout=0.3).train()
    src, tgt = tokens([6, 4], seed=3), tokens([5, 3], bos=True, seed=4)

    def run(model: Transformer) -> torch.Tensor:
        torch.manual_seed(11)
        return model(src, tgt).detach()

    environ = dict(os.environ)
    alone = {"reference": run(reference), "cpu": run(cpu)}
    assert not torch.equal(alone["reference"], alone["cpu"])  # the two backends really differ here
    for name in ("cpu", "reference", "reference", "cpu", "reference"):
        assert torch.equal(run(cpu if name == "cpu" else reference), alone[name]), name
    assert dict(os.environ) == environ
    for name in OPS_CHOICES:  # choosing a backend, and one refused, changes nothing either
        if name == "cuda":
            with pytest.raises(ConfigError):
                choose_ops(name)
        else:
            choose_ops(name)
    assert torch.equal(run(cpu), alone["cpu"]) and torch.equal(run(reference), alone["reference"])
    assert dict(os.environ) == environ


def test_choose_ops_takes_the_override_and_refuses_what_cannot_run():
    assert isinstance(choose_ops(), CpuOps) and isinstance(choose_ops("auto", "cpu"), CpuOps)
    assert isinstance(choose_ops("reference", "cpu"), ReferenceOps) and choose_ops("reference").name == "reference"
    assert type(choose_ops("reference", "meta")) is ReferenceOps
    assert isinstance(choose_ops("auto", "meta"), CudaOps)  # any device but the CPU: the GPU's paths
    with pytest.raises(ConfigError, match="train.ops='cpu' does not run on a meta device; use auto"):
        choose_ops("cpu", "meta", setting="train.ops")
    with pytest.raises(ConfigError, match="ops='cuda' does not run on a cpu device"):
        choose_ops("cuda", "cpu")
    with pytest.raises(ConfigError, match="is not one of auto, reference, cpu, cuda"):
        choose_ops("x" * 500)
    with pytest.raises(ConfigError, match=r"ops=.x{57}\.\.\.. is not"):
        choose_ops("x" * 500)


def test_training_computes_with_the_backend_train_ops_names(corpus_slice, spm_model, tmp_path, monkeypatch):
    """train.ops: reference trains on the reference backend (its loss is the one computed), auto on the cpu one."""
    from transformer_mt.training import train

    used: list[str] = []
    for cls in (ReferenceOps, CpuOps):
        real = cls.projected_loss

        def noted(self, *args, real=real, **kwargs):
            used.append(self.name)
            return real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "projected_loss", noted)
    small = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.heads=2", "model.d_ff=32"]
    limits = ["train.max_updates=1", "train.valid_bleu_sentences=-1", "train.validate_every=1000", "train.log_every=1"]
    for ops in ("reference", "auto"):
        used.clear()
        cfg = run_config(corpus_slice, spm_model, tmp_path / ops, *small, *limits, f"train.ops={ops}")
        train(cfg)
        assert used and set(used) == {"reference" if ops == "reference" else "cpu"}, (ops, used)


def test_load_computes_with_the_backend_it_is_given(tiny_checkpoint):
    from transformer_mt.decoding import Translator

    for ops, cls in (("reference", ReferenceOps), ("auto", CpuOps), ("cpu", CpuOps)):
        model = Translator.from_checkpoint(tiny_checkpoint, device="cpu", ops=ops).model
        assert isinstance(model, Transformer) and type(model.ops) is cls
        assert all(m.ops is model.ops for m in model.modules() if "ops" in vars(m))
    with pytest.raises(ConfigError, match="ops='gpu' is not one of"):
        Translator.from_checkpoint(tiny_checkpoint, device="cpu", ops="gpu")
