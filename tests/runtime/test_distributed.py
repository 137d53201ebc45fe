"""Data-parallel training: two Gloo processes on CPU train exactly what one process does on the same
global batches, hold identical parameters, write nothing from rank 1, stop together when one of
them gets SIGTERM, and resume across world sizes.

The reference is a single process with update_freq = 2 x the DDP run's: both consume the same
window of 4 global batches per update (64 pairs in 300-token batches = 5 batches per epoch, so
every other update is a 1-batch epoch remainder where rank 1 runs a zero-weight step).
Adam's eps is 1e-5, not 1e-9: the attention key biases have an exactly zero true gradient (a bias
added to every key shifts all scores of a query equally, and softmax ignores that), so their
gradients are rounding noise (~1e-10) that a tiny eps would turn into steps of size lr, different
for any other summation order.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import load_config
from transformer_mt.data import load_corpora
from transformer_mt.text import Tokenizer
from transformer_mt.training import Trainer, resumed_config, set_up, train, update_schedule

TINY = [
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "model.dropout=0.0",
    "train.lr_schedule=inverse_sqrt",
    "train.lr=0.003",
    "train.warmup_updates=4",
    "train.optimizer_eps=1e-5",
    "train.max_tokens=300",
    "train.validate_every=3",
    "train.valid_bleu_sentences=2",
    "train.log_every=1",
    "train.threads=1",
    "train.device=cpu",
]  # Gloo on CPU: on a GPU host, auto would put rank 1 on cuda:1, which a one-GPU machine lacks
pytestmark = pytest.mark.slow  # spawns two training processes
DDP_FREQ = 2  # x 2 ranks = 4 batches per update, the reference's update_freq
ATOL = 1e-5


@pytest.fixture(scope="module")
def setup(pairs64, spm_model, tmp_path_factory) -> dict:
    """The 64 short real pairs and 16 validation pairs, and the overrides every run shares (one corpus cache)."""
    root = tmp_path_factory.mktemp("ddp")
    common = [
        f"data.train_src={pairs64['train.en']}",
        f"data.train_tgt={pairs64['train.de']}",
        f"data.valid_src={pairs64['val.en']}",
        f"data.valid_tgt={pairs64['val.de']}",
        f"data.cache_dir={root / 'cache'}",
        f"tokenizer.model={spm_model}",
        *TINY,
    ]
    return {"common": common, "spm_model": spm_model}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, ports: list[int], jobs: list[dict], root: str) -> None:
    """One rank (spawned): run each job as torchrun would, on its own port. A job gives its config
    "overrides" (or one list per rank), a run to "resume" or None, where to save the final "params",
    and optionally "sigterm_rank1_at": an update after which rank 1 (only) receives SIGTERM."""
    log = open(Path(root) / f"rank{rank}.out", "w")
    os.dup2(log.fileno(), 1)  # the rank's stdout and stderr, to check that rank 1 says nothing
    os.dup2(log.fileno(), 2)
    for port, job in zip(ports, jobs):
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
        )
        overrides = job["overrides"][rank] if isinstance(job["overrides"][0], list) else job["overrides"]
        cfg = resumed_config(Path(job["resume"]), overrides) if job["resume"] else load_config(None, overrides)
        at = job.get("sigterm_rank1_at") if rank == 1 else None

        def on_update(update: int, _stats: object, at: int | None = at) -> None:
            if update == at:  # a signal mid-run, as a scheduler's
                os.kill(os.getpid(), signal.SIGTERM)

        trainer = Trainer(set_up(cfg, resume=bool(job["resume"])), on_update=on_update if at else None)
        result = trainer.run()
        torch.save(trainer.model.state_dict(), Path(job["params"]) / f"rank{rank}.pt")
        (Path(job["params"]) / f"rank{rank}.json").write_text(json.dumps([result.stop_reason, result.progress.update]))
    sys.stdout.flush()


def assert_params_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:

        def message(detail: str, key: str = key) -> str:
            return f"{key}: {detail}"

        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=message)


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_update_schedule_splits_one_process_updates_among_ranks(setup, tmp_path):
    """The batches each rank trains on (the trainer's own `update_schedule`): the premise of the comparison below."""
    cfg = load_config(None, [*setup["common"], f"train.out_dir={tmp_path}", f"train.update_freq={DDP_FREQ}"])
    tok = Tokenizer(setup["spm_model"])
    data, _ = load_corpora(cfg, tok, tok, quiet=True)
    two_ranks = list(itertools.islice(update_schedule(data, cfg.train, world_size=2), 8))
    one_process = list(
        itertools.islice(update_schedule(data, dataclasses.replace(cfg.train, update_freq=2 * DDP_FREQ)), 8)
    )
    # 5 batches per epoch: an update of 4 batches, then the epoch's remainder of 1, which leaves rank 1 without a batch
    assert [(u.epoch, u.start, len(u.batches), u.last) for u in two_ranks] == [
        (e, s, n, s == 4) for e in (1, 2, 3, 4) for s, n in ((0, 4), (4, 1))
    ]
    assert [len(u.share(1, 2)) for u in two_ranks] == [2, 0] * 4
    as_lists = lambda batches: [b.tolist() for b in batches]  # noqa: E731
    for u, ref in zip(two_ranks, one_process):
        assert (u.epoch, u.start, as_lists(u.batches)) == (ref.epoch, ref.start, as_lists(ref.batches))
        # the ranks' shares interleaved give back the update's batches: none dropped, none repeated
        shares = [u.share(rank, 2) for rank in (0, 1)]
        assert as_lists(b for pair in itertools.zip_longest(*shares) for b in pair if b is not None) == as_lists(
            u.batches
        )
        assert len(shares[0]) + len(shares[1]) == len(u.batches)
    # epochs are deterministic but differently shuffled
    assert as_lists(two_ranks[0].batches) != as_lists(two_ranks[2].batches)


def test_two_gloo_ranks_match_one_process_and_resume_across_world_sizes(setup, tmp_path):
    common = setup["common"]
    # the reference: one process, 8 updates of 4 batches; checkpoint_6.pt is its state at update 6
    ref = tmp_path / "ref"
    train(load_config(None, [*common, f"train.out_dir={ref}", "train.update_freq=4", "train.max_updates=8"]))
    from_single = tmp_path / "from_single"  # the reference at update 6, to be resumed by 2 ranks
    from_single.mkdir()
    shutil.copy(ref / "checkpoint_6.pt", from_single / "checkpoint_last.pt")

    # 2 ranks: a fresh run of 6 updates; then the single-process checkpoint resumed to update 8.
    # Rank 1 gets its own out_dir, as on a node with a local disk: it must stay uncreated.
    ddp, elsewhere = tmp_path / "ddp", tmp_path / "rank1_out"
    per_rank = [
        [*common, f"train.out_dir={out}", f"train.update_freq={DDP_FREQ}", "train.max_updates=6"]
        for out in (ddp, elsewhere)
    ]
    # Then a long run in which SIGTERM reaches rank 1 only, after update 3.
    stopped = tmp_path / "stopped"
    jobs: list[dict[str, Any]] = [
        {"overrides": per_rank, "resume": None, "params": str(tmp_path / "p1")},
        {
            "overrides": ["train.max_updates=8", f"train.update_freq={DDP_FREQ}"],
            "resume": str(from_single),
            "params": str(tmp_path / "p2"),
        },
        {
            "overrides": [*common, f"train.out_dir={stopped}", "train.max_updates=1000"],
            "resume": None,
            "params": str(tmp_path / "p3"),
            "sigterm_rank1_at": 3,
        },
    ]
    for job in jobs:
        Path(job["params"]).mkdir()
    mp.spawn(_rank_main, args=(2, [_free_port() for _ in jobs], jobs, str(tmp_path)), nprocs=2, join=True)

    # both ranks hold the same parameters, equal to one process's on the same global batches
    for phase in ("p1", "p2"):
        r0, r1 = (torch.load(tmp_path / phase / f"rank{r}.pt", weights_only=True) for r in (0, 1))
        assert_params_close(r0, r1, atol=0.0)
    ddp_state = load_checkpoint(ddp / "checkpoint_last.pt")
    assert ddp_state["progress"]["update"] == 6 and ddp_state["progress"]["epoch"] == 4  # 3 epochs of 2 updates
    assert_params_close(ddp_state["model"], load_checkpoint(ref / "checkpoint_6.pt")["model"], ATOL)
    assert_params_close(torch.load(tmp_path / "p1" / "rank1.pt", weights_only=True), ddp_state["model"], 0.0)
    # the logged losses are those of the whole global batch, not of rank 0's share
    assert losses(ddp) == pytest.approx(losses(ref)[:6], rel=1e-5)

    # only rank 0 wrote: every log line once, nothing in rank 1's out_dir, nothing printed by rank 1
    assert not elsewhere.exists()
    log = (ddp / "train.log").read_text()
    assert log.count("training data:") == 1 and log.count("validation at update 3") == 1 and "2 processes (gloo)" in log
    assert (tmp_path / "rank1.out").read_text() == ""
    assert {p.name for p in ddp.iterdir()} == {
        "train.log",
        "metrics.jsonl",
        "config.yaml",
        "checkpoint_last.pt",
        "checkpoint_best.pt",
        "checkpoint_3.pt",
        "checkpoint_6.pt",
        ".lock",
    }  # rank 0's run lock

    # a signal on one rank stops both after the same update, and rank 0 saves it
    for rank in (0, 1):
        assert json.loads((tmp_path / "p3" / f"rank{rank}.json").read_text()) == ["interrupted", 3]
    assert load_checkpoint(stopped / "checkpoint_last.pt")["progress"]["update"] == 3
    assert "interrupted at update 3" in (stopped / "train.log").read_text()

    # resume across world sizes: 2 ranks continuing the 1-process checkpoint, and 1 process continuing
    # the 2-rank checkpoint, both end where the uninterrupted reference did
    final = load_checkpoint(ref / "checkpoint_last.pt")["model"]
    assert load_checkpoint(from_single / "checkpoint_last.pt")["progress"]["update"] == 8
    assert_params_close(load_checkpoint(from_single / "checkpoint_last.pt")["model"], final, ATOL)
    result = train(resumed_config(ddp, ["train.max_updates=8", "train.update_freq=4"]), resume=True)
    assert result.progress.update == 8
    assert_params_close(load_checkpoint(ddp / "checkpoint_last.pt")["model"], final, ATOL)
