"""The parts the training loop delegates to, without training: the batching fingerprint and the progress as
checkpoints hold them, the checkpoint policy's file names and pruning, and stopping by signals (a flag, never
an exception from the handler)."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from transformer_mt.checkpoint import CheckpointError, load_checkpoint, pack_tokenizers
from transformer_mt.config import TrainConfig
from transformer_mt.training import Batching, CheckpointPolicy, Progress, Stopping
from transformer_mt.training.stopping import ValidationCutShort

# as every checkpoint holds it, from the first that had a fingerprint
SAVED = "data=multi30k.0123abcd max_tokens=300 seed=1 subword=0/1"


def batching(**changes) -> Batching:
    fields = {
        "data": "multi30k.0123abcd",
        "max_tokens": 300,
        "seed": 1,
        "subword_alpha": 0.0,
        "subword_nbest": 1,
        **changes,
    }
    return Batching.of(**fields)


def test_the_saved_batching_text_is_read_back_and_written_the_same():
    assert Batching.parse(SAVED) == batching() and batching().to_text() == SAVED
    assert Batching.parse("") is None  # a checkpoint from before the fingerprint: no check on resume
    assert batching().changes(batching(max_tokens=500, subword_alpha=0.1, subword_nbest=8)) == [
        "max_tokens 300 -> 500",
        "subword 0/1 -> 0.1/8",
    ]
    assert batching().changes(batching()) == []


def test_a_batching_alpha_compares_at_the_saved_precision():
    fine = batching(subword_alpha=0.123456789)
    assert Batching.parse(fine.to_text()) == fine  # the text keeps 6 digits; the fingerprint is built at that precision


@pytest.mark.parametrize(
    "text", ["data=x seed=1", "data=x max_tokens=many seed=1 subword=0/1", "data=x max_tokens=3 seed=1 subword=0"]
)
def test_a_damaged_batching_text_names_the_fix(text):
    with pytest.raises(CheckpointError, match="the checkpoint is damaged, resume from another one"):
        Batching.parse(text)


def test_progress_state_dict_holds_plain_types_and_round_trips():
    p = Progress(update=7, epoch=2, batch_in_epoch=3, best=4.5, batching=batching())
    state = p.state_dict()
    assert state["batching"] == SAVED and all(isinstance(v, (int, float, str, type(None))) for v in state.values())
    assert Progress.from_state_dict(state) == p
    assert Progress.from_state_dict({**state, "batching": ""}).batching is None


def test_progress_counts_validations_for_patience():
    p = Progress(update=4)
    p.validated(3.0, improved=True)
    p.update = 6
    p.validated(3.5, improved=False)
    assert (p.best, p.bad_validations, p.last_validated) == (3.0, 1, 6)


# ---------------------------------------------------------------- the checkpoint policy
def test_policy_names_best_before_numbered_before_last(tmp_path):
    every_validation = CheckpointPolicy(tmp_path, TrainConfig(validate_every=10, save_every=0))
    assert [p.name for p in every_validation.after_validation(10, improved=True)] == [
        "checkpoint_best.pt",
        "checkpoint_10.pt",
        "checkpoint_last.pt",
    ]
    assert [p.name for p in every_validation.after_validation(20, improved=False)] == [
        "checkpoint_20.pt",
        "checkpoint_last.pt",
    ]
    assert every_validation.between_validations(5) == []
    spaced = CheckpointPolicy(tmp_path, TrainConfig(validate_every=10, save_every=4))
    assert [p.name for p in spaced.after_validation(10, improved=False)] == ["checkpoint_last.pt"]
    assert [p.name for p in spaced.between_validations(8)] == ["checkpoint_8.pt", "checkpoint_last.pt"]
    assert spaced.between_validations(9) == []


@pytest.mark.parametrize(
    ("metric", "val", "best", "improves"),
    [("loss", {"val_loss": 2.0}, 2.5, True), ("bleu", {"val_loss": 2.0, "val_bleu": 30.0}, 31.0, False)],
)
def test_policy_best_metric(tmp_path, metric, val, best, improves):
    policy = CheckpointPolicy(tmp_path, TrainConfig(best_metric=metric))
    assert policy.improves(val, best) is improves and policy.improves(val, None)


def test_policy_save_writes_every_name_and_prunes_after_a_numbered_one(tmp_path):
    policy = CheckpointPolicy(tmp_path, TrainConfig(keep_last=2, keep_every=4))
    state = {"model": {"w": torch.ones(2)}, "tokenizers": pack_tokenizers(b"spm")}
    for update in range(1, 7):
        policy.save({**state, "progress": {"update": update}}, policy.after_validation(update, improved=update == 2))
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "checkpoint_4.pt",
        "checkpoint_5.pt",
        "checkpoint_6.pt",
        "checkpoint_best.pt",
        "checkpoint_last.pt",
    ]
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["progress"]["update"] == 2
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["progress"]["update"] == 6


# ---------------------------------------------------------------- stopping
def test_signals_only_set_the_flag_and_a_second_sigint_aborts():
    stopping, before = Stopping(), signal.getsignal(signal.SIGINT)
    with stopping.signals(verbose=False):
        os.kill(os.getpid(), signal.SIGTERM)  # returns: the handler raised nothing
        assert stopping.requested
        with pytest.raises(KeyboardInterrupt):  # the second signal, a Ctrl-C: Python's own handler aborts
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_stop_is_raised_at_the_next_forward_of_the_checked_module():
    stopping, layer = Stopping(), torch.nn.Linear(2, 2)
    with stopping.checked_before(layer):
        layer(torch.ones(2))
        stopping.request()
        with pytest.raises(ValidationCutShort):
            layer(torch.ones(2))
    layer(torch.ones(2))  # the check is gone after the block
