"""The model on packed sentences (``Transformer.encode_packed`` / ``decode_packed``, ``TeacherForcedLoss(packing=...)``)
against the padded batch, and against each sentence alone.

The training loss and every parameter's gradient are compared on real Multi30k token-budget batches, dropout 0,
float32, for the post-norm, pre-norm and scale-norm models, on the reference and the cpu backends. Tolerance: 1e-5
relative (the loss; a gradient relative to its largest entry): the two layouts sum the same float32 terms in other
orders, nothing more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import head, tiny_model
from transformer_mt.data import Batch, collate, make_batches, pack
from transformer_mt.model import BlockDiagonal, Packing, Segments, TeacherForcedLoss, Transformer, choose_ops
from transformer_mt.text import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _packing(batch: Batch, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Packing]:
    p = pack(batch, pad=pad)
    src = Segments(p.src_cu_seqlens, p.src_max_len, p.src_positions)
    return p.src, p.tgt_in, p.tgt_out, Packing(src, Segments(p.tgt_cu_seqlens, p.tgt_max_len, p.tgt_positions))


@pytest.fixture(scope="module")
def real_batches(corpus_slice, spm_model) -> tuple[int, list[Batch]]:
    """Two token-budget batches of real pairs (budget 600: about 40 sentences each, sources padded)."""
    tok = Tokenizer(spm_model)
    src = tok.encode(head(corpus_slice["train.en"], 300, skip=500))
    tgt = tok.encode(head(corpus_slice["train.de"], 300, skip=500))
    ls, lt = np.array([len(s) + 1 for s in src]), np.array([len(t) + 1 for t in tgt])
    chosen = make_batches(ls, lt, 600, seed=1, epoch=1)[:2]
    return tok.vocab_size, [collate([(src[i], tgt[i]) for i in idx], indices=idx) for idx in chosen]


def _loss_and_grads(model: Transformer, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    loss, nll, ntokens = TeacherForcedLoss(model, label_smoothing=0.1)(*args, **kwargs)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), nll.detach(), grads


@pytest.mark.parametrize("ops", ["reference", "cpu"])
@pytest.mark.parametrize("norm", ["post", "pre", "scale"])
def test_packed_loss_and_gradients_equal_the_padded_batch_on_real_pairs(norm, ops, real_batches):
    vocab, batches = real_batches
    model = tiny_model(vocab, norm=norm, positions="learned", max_positions=128).train()  # dropout 0
    model.use_ops(choose_ops(ops))
    for batch in batches:
        assert batch.src_padded  # sources of several lengths: the padded batch masks keys
        padded = _loss_and_grads(
            model, (batch.src, batch.tgt_in, batch.tgt_out, batch.labels), {"src_padded": batch.src_padded}
        )
        src, tgt_in, tgt_out, packing = _packing(batch)
        assert packing.src.cu_seqlens.numel() == batch.nsentences + 1
        packed = _loss_and_grads(model, (src, tgt_in, tgt_out), {"packing": packing})
        torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=0)
        torch.testing.assert_close(packed[1], padded[1], rtol=1e-5, atol=0)
        assert packed[2].keys() == padded[2].keys() == {n for n, _ in model.named_parameters()}
        for name, grad in padded[2].items():
            scale = float(grad.abs().max())
            torch.testing.assert_close(packed[2][name], grad, rtol=1e-5, atol=1e-5 * scale, msg=f"{name} differs")


@pytest.mark.parametrize("norm", ["post", "pre", "scale"])
def test_packed_encoder_and_decoder_give_the_padded_rows(norm, real_batches):
    """encode_packed's rows are encode's at the real source positions; decode_packed's logits are decode's at the
    labels, in Batch.labels order."""
    vocab, batches = real_batches
    model = tiny_model(vocab, norm=norm, max_positions=128)
    batch = batches[0]
    src, tgt_in, _, packing = _packing(batch)
    with torch.no_grad():
        enc = model.encode(batch.src)
        packed_enc = model.encode_packed(src, packing.src)
        torch.testing.assert_close(packed_enc.memory, enc.memory[~enc.src_pad], rtol=1e-5, atol=1e-5)
        logits = model.decode(batch.tgt_in, enc).reshape(-1, model.output_size)[batch.labels]
        torch.testing.assert_close(model.decode_packed(tgt_in, packing.tgt, packed_enc), logits, rtol=1e-5, atol=1e-5)


def _alone(model: Transformer, pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sentence encoded and decoded in a batch of its own (no padding anywhere), rows concatenated."""
    memory, logits = [], []
    for pair in pairs:
        b = collate([pair])
        enc = model.encode(b.src, padded=False)
        memory.append(enc.memory[0])
        logits.append(model.decode(b.tgt_in, enc)[0])
    return torch.cat(memory), torch.cat(logits)


SHAPES = {  # (source pieces, target pieces) per sentence
    "mixed": [(5, 3), (1, 7), (9, 2), (3, 3)],
    "one sentence": [(6, 4)],
    "one-token sentences": [(0, 0), (0, 0), (0, 0)],  # source EOS alone, decoder start alone
}


@pytest.mark.parametrize("case", SHAPES)
def test_packed_sentences_give_each_sentence_alone(case):
    """An independent check of the block-diagonal masks and the restarting positions: packed, every sentence's
    encoder rows and logits are those of the sentence run alone. Positions restart per sentence: the packed rows
    outnumber the learned position table."""
    gen = torch.Generator().manual_seed(1)
    pairs = [
        (torch.randint(4, 40, (n,), generator=gen).tolist(), torch.randint(4, 40, (m,), generator=gen).tolist())
        for n, m in SHAPES[case]
    ]
    model = tiny_model(positions="learned", max_positions=10)
    src, tgt_in, _, packing = _packing(collate(pairs))
    with torch.no_grad():
        enc = model.encode_packed(src, packing.src)
        memory, logits = _alone(model, pairs)
        torch.testing.assert_close(enc.memory, memory, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.decode_packed(tgt_in, packing.tgt, enc), logits, rtol=1e-5, atol=1e-5)


def test_a_packed_sentence_longer_than_the_position_table_is_refused():
    model = tiny_model(positions="learned", max_positions=8)
    src, _, _, packing = _packing(collate([([5] * 3, [6]), ([7] * 8, [8])]))  # 4 and 9 positions
    with pytest.raises(ValueError, match="needs 9 positions but model.max_positions=8"):
        model.encode_packed(src, packing.src)


def test_packed_attention_gives_no_weights():
    model = tiny_model()
    src, _, _, packing = _packing(collate([([5, 6], [7])]))
    layer = model.encoder[0].self_attn
    x = model.src_embed(src)[None]  # (1, N, D)
    with pytest.raises(ValueError, match="no attention weights"):
        layer.attend(*layer.project_qkv(x), BlockDiagonal(packing.src, packing.src), need_weights=True)


def test_packed_training_with_dropout_runs_and_draws_its_masks_over_the_packed_tokens(real_batches):
    """With dropout the layouts give different numbers (other masks); the packed loss stays finite and every
    parameter gets a gradient."""
    vocab, batches = real_batches
    model = tiny_model(vocab, dropout=0.3, attention_dropout=0.1, activation_dropout=0.1).train()
    src, tgt_in, tgt_out, packing = _packing(batches[0])
    torch.manual_seed(0)
    loss, _, grads = _loss_and_grads(model, (src, tgt_in, tgt_out), {"packing": packing})
    assert torch.isfinite(loss) and grads.keys() == {n for n, _ in model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values())
