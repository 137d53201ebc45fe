"""The special ids as config keys: a model whose vocabulary puts EOS, UNK, PAD and the decoder's start elsewhere
(MarianMT's layout) must compute exactly what the same model computes with tmt's ids, once the vocabulary is
permuted. Every layer that uses an id (batches, padding masks, the loss, greedy and beam search, output
restriction) is exercised through that equivalence, so a place that still assumed PAD 0 / BOS 2 / EOS 3 fails."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY_VOCAB, tiny_model, tiny_model_config
from transformer_mt.config import ConfigError, specials_problem
from transformer_mt.data import collate
from transformer_mt.decoding import beam_search, greedy_search
from transformer_mt.model import TeacherForcedLoss, Transformer
from transformer_mt.text import SpecialIds

pytestmark = pytest.mark.usefixtures("one_thread")

V = TINY_VOCAB
# tmt's ids pad 0, unk 1, bos 2, eos 3 move to eos 0, unk 1, pad V-1 and (bos, the decoder's start) V-2; the
# other ids shift up by one to fill the gap: a bijection of 0..V-1.
PERM = torch.tensor([V - 1, 1, V - 2, 0] + [i - 2 for i in range(4, V)])
MOVED = {"pad_id": V - 1, "unk_id": 1, "bos_id": -1, "eos_id": 0, "decoder_start_id": V - 2}


def _pair(seed: int = 0, **changes):
    """(model with tmt's ids, the same model with its vocabulary permuted by PERM and the ids moved with it)."""
    a = tiny_model(seed=seed, **changes)
    b = Transformer(tiny_model_config(**changes, **MOVED), src_vocab_size=V, tgt_vocab_size=V).eval()
    state = a.state_dict()
    for name, tensor in state.items():
        if name in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight", "output_proj.bias"):
            moved = torch.empty_like(tensor)
            moved[PERM] = tensor  # row i of a is row PERM[i] of b
            state[name] = moved
        elif name == "output_ids":
            state[name] = PERM[tensor].sort().values
    b.load_state_dict(state)
    return a, b


def _sentences(seed: int, n: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(4, V, (int(length),), generator=g).tolist() for length in torch.randint(2, 9, (n,), generator=g)
    ]


def test_specials_of_a_config_default_to_tmts_ids_and_follow_the_keys():
    assert SpecialIds.of(tiny_model_config()) == SpecialIds(pad=0, unk=1, bos=2, eos=3, start=2)
    marian = SpecialIds.of(tiny_model_config(pad_id=V - 1, eos_id=0, bos_id=-1, decoder_start_id=V - 1))
    assert (marian.start, marian.never_generated, sorted(marian.not_text)) == (V - 1, (V - 1,), [0, V - 1])


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"pad_id": 3}, "model.pad_id"),  # pad = eos
        ({"unk_id": 0}, "model.pad_id"),  # pad = unk
        ({"bos_id": -1}, "model.decoder_start_id"),  # no bos and no start id
        ({"decoder_start_id": 3}, "model.decoder_start_id"),  # the decoder would start from EOS
        ({"eos_id": -1}, "model.eos_id"),
        ({"eos_id": V}, "model.eos_id"),  # outside the vocabulary
    ],
)
def test_impossible_special_ids_are_refused_naming_the_key(changes, key):
    cfg = tiny_model_config(**changes)
    problem = specials_problem(cfg, V)
    assert problem is not None and problem.key == key
    with pytest.raises(ConfigError, match=key):
        Transformer(cfg, src_vocab_size=V, tgt_vocab_size=V)


def test_collate_uses_the_models_ids():
    ids = SpecialIds(pad=9, unk=1, bos=-1, eos=0, start=8)
    batch = collate([([4, 5], [6]), ([4], [6, 7])], specials=ids)
    assert batch.src.tolist() == [[4, 5, 0], [4, 0, 9]]
    assert batch.tgt_in.tolist() == [[8, 6, 9], [8, 6, 7]]
    assert batch.tgt_out.tolist() == [[6, 0, 9], [6, 7, 0]]
    assert batch.labels is not None and batch.labels.tolist() == [0, 1, 3, 4, 5] and batch.ntokens == 5


@pytest.mark.parametrize("restrict", [False, True])
def test_teacher_forced_loss_is_the_same_under_the_permuted_vocabulary(restrict):
    a, b = _pair(restrict_output=restrict, output_bias=True)
    with torch.no_grad():
        a.output_proj.bias.normal_()
        b.output_proj.bias[PERM] = a.output_proj.bias
    if restrict:  # keep a third of the pieces: both models must keep the same ones, specials included
        kept = torch.arange(4, V, 3)
        a.restrict_output_to(kept)
        b.restrict_output_to(PERM[kept])
        assert PERM[a.output_ids].sort().values.tolist() == b.output_ids.tolist()
    pairs = list(zip(_sentences(1), _sentences(2)))
    batch_a = collate(pairs, specials=a.specials)
    batch_b = collate(
        [(PERM[torch.tensor(s)].tolist(), PERM[torch.tensor(t)].tolist()) for s, t in pairs], specials=b.specials
    )
    for with_labels in (True, False):  # the labels found at collation, or from the padding by the loss itself
        la = TeacherForcedLoss(a, label_smoothing=0.1)(
            batch_a.src, batch_a.tgt_in, batch_a.tgt_out, batch_a.labels if with_labels else None
        )
        lb = TeacherForcedLoss(b, label_smoothing=0.1)(
            batch_b.src, batch_b.tgt_in, batch_b.tgt_out, batch_b.labels if with_labels else None
        )
        assert la[2] == lb[2] == batch_a.ntokens  # every EOS label counted: b's EOS is id 0
        torch.testing.assert_close(la[0], lb[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(la[1], lb[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam", [1, 3])
def test_search_is_the_same_under_the_permuted_vocabulary(beam):
    a, b = _pair(seed=3)
    srcs = _sentences(4, n=8)
    src_a = collate([(s, []) for s in srcs], specials=a.specials).src
    src_b = collate([(PERM[torch.tensor(s)].tolist(), []) for s in srcs], specials=b.specials).src
    run = (
        (lambda m, s: [[h] for h in greedy_search(m, s, max_len_b=12)])
        if beam == 1
        else (lambda m, s: beam_search(m, s, beam=beam, nbest=beam, max_len_b=12))
    )
    hyps_a, hyps_b = run(a, src_a), run(b, src_b)
    lengths = set()
    for nbest_a, nbest_b in zip(hyps_a, hyps_b):
        for ha, hb in zip(nbest_a, nbest_b, strict=True):
            assert PERM[torch.tensor(ha.tokens, dtype=torch.long)].tolist() == hb.tokens
            assert ha.score == pytest.approx(hb.score, abs=1e-4)
            lengths.add(len(ha.tokens))
            assert b.specials.start not in hb.tokens and b.specials.pad not in hb.tokens
    assert len(lengths) > 1  # random weights still end sentences at different lengths: EOS (b's id 0) was found


def test_a_decoder_starting_from_the_pad_id_attends_to_its_first_position():
    """MarianMT's decoder starts from the pad id: position 0 of the decoder input is not padding."""
    model = tiny_model(config=tiny_model_config(**{**MOVED, "decoder_start_id": V - 1}))
    batch = collate([([5, 6, 7], [8, 9]), ([5], [8])], specials=model.specials)
    assert batch.tgt_in[:, 0].tolist() == [V - 1, V - 1]
    weights = model.attention(batch.src, batch.tgt_in)
    for layer in weights.decoder:  # (B, H, T, T): the first row attends to position 0 alone, fully
        torch.testing.assert_close(layer[:, :, 0, 0], torch.ones_like(layer[:, :, 0, 0]))
        assert torch.all(layer[1, :, :, 2] == 0)  # the short row's padding key gets nothing


def test_an_ensemble_refuses_members_with_different_special_ids():
    from transformer_mt.model import Ensemble

    a, b = _pair()
    with pytest.raises(ValueError, match="different special ids"):
        Ensemble([a, b])
    assert Ensemble([b, b]).specials == b.specials
