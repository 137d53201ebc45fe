"""Packed batches (data.packing): the layout on crafted lengths, the tokens of crafted pairs written out by hand, and
real Multi30k batches against their padded form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import head
from transformer_mt.data import PackedBatch, collate, make_batches, pack
from transformer_mt.data.packing import segments
from transformer_mt.text import BOS_ID, EOS_ID, PAD_ID, SpecialIds


@pytest.mark.parametrize(
    ("lengths", "cu", "positions"),
    [
        ([3, 1, 4], [0, 3, 4, 8], [0, 1, 2, 0, 0, 1, 2, 3]),
        ([5], [0, 5], [0, 1, 2, 3, 4]),  # a single sentence
        ([1, 1, 1, 1], [0, 1, 2, 3, 4], [0, 0, 0, 0]),  # one-token sentences
        ([2, 6, 2], [0, 2, 8, 10], [0, 1, 0, 1, 2, 3, 4, 5, 0, 1]),
    ],
)
def test_segments_give_cumulative_lengths_and_positions_restarting_per_sentence(lengths, cu, positions):
    cu_seqlens, pos, longest = segments(np.array(lengths))
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == cu  # flash attention's varlen convention
    assert pos.dtype == torch.int64 and pos.tolist() == positions
    assert longest == max(lengths)


def test_segments_of_no_sentence_are_one_zero():
    cu_seqlens, pos, longest = segments(np.array([], dtype=np.int64))
    assert cu_seqlens.tolist() == [0] and pos.numel() == 0 and longest == 0


PAIRS = [([11, 12, 13], [21, 22]), ([14], [23, 24, 25, 26]), ([15, 16], []), ([17, 18, 19, 20, 30], [27])]


def test_pack_concatenates_sources_decoder_inputs_and_labels_sentence_after_sentence():
    """Expectations written from the conventions: a source is pieces + EOS, the decoder input BOS + pieces, the labels
    pieces + EOS (an empty target gives BOS alone and EOS alone)."""
    batch = collate(PAIRS)
    p = pack(batch, pad=PAD_ID)
    assert p.src.tolist() == [11, 12, 13, EOS_ID, 14, EOS_ID, 15, 16, EOS_ID, 17, 18, 19, 20, 30, EOS_ID]
    assert p.tgt_in.tolist() == [BOS_ID, 21, 22, BOS_ID, 23, 24, 25, 26, BOS_ID, BOS_ID, 27]
    assert p.tgt_out.tolist() == [21, 22, EOS_ID, 23, 24, 25, 26, EOS_ID, EOS_ID, 27, EOS_ID]
    assert p.src_cu_seqlens.tolist() == [0, 4, 6, 9, 15] and p.src_max_len == 6
    assert p.tgt_cu_seqlens.tolist() == [0, 3, 8, 9, 11] and p.tgt_max_len == 5
    assert p.src_positions.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert p.tgt_positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 1]
    assert p.ntokens == batch.ntokens == 11 and p.nsentences == 4


def test_pack_keeps_a_start_id_equal_to_the_pad_id():
    """MarianMT's decoder starts from the pad id: the start is counted as a token, not taken for padding."""
    marian = SpecialIds(pad=7, unk=1, bos=-1, eos=0, start=7)
    p = pack(collate([([11, 12], [21, 22, 23]), ([13], [24])], specials=marian), pad=marian.pad)
    assert p.tgt_in.tolist() == [7, 21, 22, 23, 7, 24]
    assert p.tgt_out.tolist() == [21, 22, 23, 0, 24, 0]
    assert p.src.tolist() == [11, 12, 0, 13, 0]
    assert p.tgt_cu_seqlens.tolist() == [0, 4, 6] and p.src_cu_seqlens.tolist() == [0, 3, 5]


def test_to_moves_every_tensor_and_keeps_the_host_ints():
    p = pack(collate(PAIRS, indices=[5, 6, 7, 8]), pad=PAD_ID)
    moved = p.to("meta")  # a device without data: every tensor field must land there
    tensors = [name for name, value in vars(moved).items() if isinstance(value, torch.Tensor)]
    assert len(tensors) == 8 and all(getattr(moved, name).device.type == "meta" for name in tensors)
    assert (moved.src_max_len, moved.tgt_max_len, moved.ntokens) == (p.src_max_len, p.tgt_max_len, p.ntokens)


def test_real_multi30k_batches_pack_to_their_labels_and_lengths(corpus_slice, tok):
    """The token-budget batches training builds, collated then packed: each packed label row is the padded batch's
    labels in Batch.labels order, and the lengths are the corpus's (pieces + EOS; BOS + pieces)."""
    src = tok.encode(head(corpus_slice["train.en"], 400))
    tgt = tok.encode(head(corpus_slice["train.de"], 400))
    ls = np.array([len(s) for s in src]) + 1
    lt = np.array([len(t) for t in tgt]) + 1
    batches = make_batches(ls, lt, 1024, seed=3, epoch=1)
    assert len(batches) > 5
    for idx in batches:
        batch = collate([(src[i], tgt[i]) for i in idx], indices=idx)
        p = pack(batch, pad=PAD_ID)
        assert isinstance(p, PackedBatch)
        assert p.src_cu_seqlens.diff().tolist() == ls[idx].tolist()
        assert p.tgt_cu_seqlens.diff().tolist() == lt[idx].tolist()
        assert batch.labels is not None
        assert torch.equal(p.tgt_out, batch.tgt_out.reshape(-1)[batch.labels])
        assert p.ntokens == batch.ntokens == p.tgt_out.numel() == int(lt[idx].sum())
        for k, i in enumerate(idx[:3]):  # a few sentences written out
            s0, s1 = p.src_cu_seqlens[k : k + 2].tolist()
            t0, t1 = p.tgt_cu_seqlens[k : k + 2].tolist()
            assert p.src[s0:s1].tolist() == [*src[i], EOS_ID]
            assert p.tgt_in[t0:t1].tolist() == [BOS_ID, *tgt[i]]
