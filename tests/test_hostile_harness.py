"""The hostile-input harness itself: the address-space cap stops a huge allocation, and the one-line check
refuses what is not one line."""

from __future__ import annotations

import pytest
import torch

from tests.hostile import Outcome, address_space_limit, assert_refused_in_one_line, run_tmt


def test_the_cap_turns_a_huge_allocation_into_an_error_and_is_lifted_after():
    with address_space_limit(256), pytest.raises((MemoryError, RuntimeError)):
        torch.empty(2**33, dtype=torch.uint8)  # 8 GiB
    assert torch.empty(2**29, dtype=torch.uint8).numel() == 2**29  # 512 MiB once the cap is gone


def test_a_refusal_must_be_one_line_naming_the_file():
    assert_refused_in_one_line(
        Outcome(2, "", "tmt: error: a.pt: model.heads=0: must be positive\n", 0.0), names=["a.pt", "model.heads"]
    )
    for bad in (
        Outcome(1, "", "tmt: error: a.pt: bad\n", 0.0),  # exit code
        Outcome(2, "", "summary\ntmt: error: a.pt: bad\n", 0.0),  # a line before it
        Outcome(2, "", "tmt: error: bad\n", 0.0),  # the file not named
        Outcome(2, "", "tmt: error: a.pt: bad\n", 1e6),  # the memory bound
    ):
        with pytest.raises(AssertionError):
            assert_refused_in_one_line(bad, names=["a.pt"])


def test_run_tmt_captures_a_refusal_of_the_real_command_line(tmp_path):
    missing = tmp_path / "nothing.pt"
    outcome = run_tmt(["inspect", missing], suite="harness")
    assert_refused_in_one_line(outcome, names=[missing.name])
