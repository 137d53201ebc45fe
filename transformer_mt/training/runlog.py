"""What a training run shows: `train.log` and a progress bar for people, `metrics.jsonl` for programs.

`RunLog` owns both files of a run directory and the progress bar. On ranks other than 0 of a
data-parallel run it is silent from the start and every call does nothing, so the trainer calls it
unconditionally. On a terminal, training progress is a bar (loss, lr, tokens/s); otherwise each
"train" record is also a line of train.log.

`metrics.jsonl` holds one JSON object per line, appended as training goes (a resumed run appends
to the same file, after dropping the records of updates later than the checkpoint it resumes from,
so each update's record appears once). Every record has a ``"kind"``; a reader selects by kind and ignores keys it does
not know (later versions may add keys, never rename or remove them). Losses are per target token
(pieces + EOS, padding excluded), in nats.

``kind: "train"``, every ``train.log_every`` updates, over the updates since the previous one:
    update        optimizer updates done so far (int)
    epoch         the epoch the last of those updates belongs to (1-based)
    wall          training seconds since the run began, earlier sessions of a resumed run included
    loss          label-smoothed cross-entropy (the optimised objective)
    nll           cross-entropy without smoothing
    ppl           exp(nll)
    lr            learning rate of the last update
    gnorm         gradient norm of the last update, before clipping
    tokens        target tokens trained on in the window
    tokens_per_s  target tokens per second of the window's training time (validation and checkpoint saves excluded)
    updates_per_s updates per second of the same time
    share/<name>  with several corpora (data.corpora): corpus <name>'s share of the target tokens trained on so far,
                  over the whole run (a "corpora" line of train.log shows them too)

``kind: "valid"``, at every validation (``train.validate_every`` updates, and at the end):
    update, epoch, wall   as for "train"
    val_loss      label-smoothed cross-entropy over the whole validation set
    val_nll       cross-entropy over the whole validation set
    val_ppl       exp(val_nll)
    val_bleu      sacreBLEU on the first ``train.valid_bleu_sentences`` pairs; absent when BLEU is off (-1)
    best          true when this validation improved ``train.best_metric`` (checkpoint_best.pt was written)
    valid/<name>/loss, valid/<name>/bleu
                  with data.valid: set <name>'s own val_loss and val_bleu; val_loss, val_nll and val_bleu are then
                  the means over the sets (val_ppl the exp of the mean val_nll), and train.log has a line per set
    valid_seconds seconds this validation took

``kind: "summary"``, once at the end of each session (``tmt train`` or ``--resume``), after the last save:
    update, epoch, wall   where training stopped (epoch: the next one to start when an epoch just ended;
                          wall: training seconds of the whole run)
    stop_reason   why: "max_updates=N reached", "max_epochs=N reached", "max_time=M minutes reached",
                  "no improvement in N validations (patience)" or "interrupted"
    target_tokens target tokens trained on over the whole run
    last_valid    the last validation's val_* values ({} when the run has no validation set)
    train_flops   training FLOPs of the whole run: 3 x the matmul FLOPs of each padded batch's forward
                  (runtime/flops.py, the benchmark's count; all ranks)
    flops_per_token  train_flops / target_tokens
    update_seconds   seconds inside updates (forward, backward, optimizer), validation and checkpoints excluded
    achieved_tflops  train_flops / update_seconds / 1e12
    peak_tflops   the matmul peak compared against (all ranks together); peak_source: "config"
                  (train.peak_tflops) or "measured (<cache file>)", measured once per machine, dtype and threads
    mfu           achieved / peak (model FLOPs utilisation); mfu_wall the same over the wall time
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from transformer_mt.runtime import flops
from transformer_mt.text import name_write_errors
from transformer_mt.training.state import Progress
from transformer_mt.training.step import UpdateStats

if TYPE_CHECKING:  # imported when a bar is shown: a terminal only
    from tqdm import tqdm

KINDS = ("train", "valid", "summary")


class RunLog:
    """Writes `train.log` (time-stamped lines, echoed on stderr) and `metrics.jsonl` (records with a kind)."""

    def __init__(self, out_dir: Path | None, *, tensorboard: bool = False):
        """Open (append to) the files in `out_dir`; None: a silent log (ranks other than 0). With `tensorboard`,
        every record's numbers also go to TensorBoard event files in `out_dir`/tensorboard."""
        self.log_file = self.metrics_file = self.tb = None
        self.bar: tqdm | None = None
        self.metrics_path = None if out_dir is None else Path(out_dir) / "metrics.jsonl"
        if out_dir is not None:
            if tensorboard:  # first: without the package the run stops before a file is opened
                from transformer_mt.training.tensorboard import TensorBoardLog

                self.tb = TensorBoardLog(Path(out_dir) / "tensorboard")
            self.log_file = open(Path(out_dir) / "train.log", "a", encoding="utf-8")
            self.metrics_file = open(Path(out_dir) / "metrics.jsonl", "a", encoding="utf-8")

    def drop_after(self, update: int) -> int:
        """Remove the metrics.jsonl records of updates after `update`, and a torn last line: a resume from the
        checkpoint of `update` trains those updates again, and their records would appear twice. Returns how
        many lines went. The file is rewritten through a temporary file renamed into place."""
        path = self.metrics_path
        if self.metrics_file is None or path is None or not path.is_file():
            return 0
        self.metrics_file.close()
        kept, dropped = [], 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                keep = json.loads(line).get("update", 0) <= update
            except (ValueError, AttributeError):  # torn by a kill mid-write, or not a record
                keep = False
            if keep:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with name_write_errors(str(path)):
                tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
                os.replace(tmp, path)
        self.metrics_file = open(path, "a", encoding="utf-8")
        return dropped

    # ------------------------------------------------------------ the three kinds of record
    def train(
        self, *, update: int, epoch: int, wall: float, corpora: dict[str, int] | None = None, **window: float
    ) -> None:
        """A "train" record: `window` is `Window.flush()`; `corpora`, with several, the target tokens trained on
        from each so far (Progress.corpus_tokens), shown as shares."""
        shares = corpus_shares(corpora or {})
        rec = {
            "update": update,
            "epoch": epoch,
            "wall": round(wall, 2),
            **window,
            **{f"share/{name}": round(share, 4) for name, share in shares.items()},
        }
        self.record("train", **rec)
        if self.bar is not None and not self.bar.disable:
            self.bar.set_postfix(loss=f"{rec['loss']:.3f}", lr=f"{rec['lr']:.2e}", tok_s=f"{rec['tokens_per_s']:.0f}")
        else:
            self.log(
                f"update {update} epoch {epoch}: loss {rec['loss']:.3f} ppl {rec['ppl']:.2f} lr {rec['lr']:.3e} "
                f"{rec['tokens_per_s']:.0f} tgt tok/s"
            )
        if shares:
            shown = ", ".join(f"{name} {100 * share:.1f}%" for name, share in shares.items())
            self.log(f"corpora at update {update}: {shown} of the target tokens so far")

    def valid(self, *, update: int, epoch: int, wall: float, val: dict[str, float], best: bool, seconds: float) -> None:
        """A "valid" record and its log line; `val` holds the val_* values."""
        self.record(
            "valid",
            update=update,
            epoch=epoch,
            wall=round(wall, 2),
            **{k: round(v, 4) for k, v in val.items()},
            best=best,
            valid_seconds=round(seconds, 2),
        )
        shown = ", ".join(f"{k[4:]} {v:.2f}" for k, v in val.items() if k.startswith("val_"))
        means = " (means over the sets)" if any(k.startswith("valid/") for k in val) else ""
        self.log(f"validation at update {update}{means}: {shown}{' (best)' if best else ''}")
        sets: dict[str, list[str]] = {}
        for key, value in val.items():
            if key.startswith("valid/"):
                name, metric = key[len("valid/") :].rsplit("/", 1)
                sets.setdefault(name, []).append(f"{metric} {value:.2f}")
        for name, values in sets.items():
            self.log(f"validation at update {update}, {name}: {', '.join(values)}")

    def summary(
        self,
        *,
        update: int,
        epoch: int,
        wall: float,
        stop_reason: str,
        target_tokens: int,
        last_valid: dict[str, float],
        cost: dict | None = None,
    ) -> None:
        """The "summary" record of a session's end; `cost` adds flops.cost_summary()'s fields."""
        self.record(
            "summary",
            update=update,
            epoch=epoch,
            wall=round(wall, 2),
            stop_reason=stop_reason,
            target_tokens=int(target_tokens),
            last_valid={k: round(v, 4) for k, v in last_valid.items()},
            **(cost or {}),
        )

    def end(
        self, p: Progress, *, reason: str, interrupted: bool, last_valid: dict[str, float], cost: dict, out: Path
    ) -> None:
        """A session's end: the "summary" record, the cost line, and how to continue an interrupted run."""
        self.summary(
            update=p.update,
            epoch=p.epoch,
            wall=p.elapsed,
            stop_reason=reason,
            target_tokens=p.tokens,
            last_valid=last_valid,
            cost=cost,
        )
        self.log(flops.format_cost(cost, tokens=p.tokens, wall_seconds=p.elapsed))
        if interrupted:
            self.log(
                f"interrupted at update {p.update}: saved {out / 'checkpoint_last.pt'}; "
                f"continue with `tmt train --resume {out}`"
            )
        else:
            self.log(f"stopped at update {p.update} (epoch {p.epoch}): {reason}; checkpoints in {out}")

    # ------------------------------------------------------------ the progress bar (a terminal only)
    def start_progress(self, *, total: int | None, initial: int) -> None:
        if self.log_file is not None and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="upd", dynamic_ncols=True, leave=False)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def end_progress(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    # ------------------------------------------------------------ the files

    def log(self, msg: str) -> None:
        """One line in train.log, with a time stamp, and on stderr (above the progress bar)."""
        if self.log_file is None:
            return
        with name_write_errors(self.log_file.name):  # a full disk names train.log
            self.log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
            self.log_file.flush()
        echo(msg)

    def record(self, kind: str, **fields: Any) -> None:
        """Append one record of `kind` (see the module docstring for each kind's fields)."""
        assert kind in KINDS, kind
        if self.metrics_file is None:
            return
        with name_write_errors(self.metrics_file.name):
            self.metrics_file.write(json.dumps({"kind": kind, **fields}) + "\n")
            self.metrics_file.flush()
        if self.tb is not None:
            self.tb.record({"kind": kind, **fields})

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        for handle in (self.log_file, self.metrics_file):
            if handle is not None:
                handle.close()
        self.log_file = self.metrics_file = None


def corpus_shares(tokens: dict[str, int]) -> dict[str, float]:
    """Each corpus's share of the target tokens in `tokens` (by name); {} for fewer than two corpora."""
    total = sum(tokens.values())
    return {name: n / total for name, n in tokens.items()} if len(tokens) > 1 and total else {}


class Window:
    """Sums training stats between two "train" records."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss: torch.Tensor | float = 0.0  # summed on the device when the updates' sums are device tensors
        self.nll: torch.Tensor | float = 0.0
        self.tokens = 0.0
        self.updates = 0
        self.lr = self.gnorm = 0.0
        self.tic = time.perf_counter()
        self.excluded = 0.0  # seconds spent paused (validation, checkpoints)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside the block does not count towards the window's tokens/s and updates/s."""
        tic = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - tic

    def add(self, stats: UpdateStats) -> None:
        """Count one update's stats. Its loss and nll may be device tensors: summed there, read once per window by
        flush()."""
        self.loss += stats.loss
        self.nll += stats.nll
        self.tokens += stats.tokens
        self.updates += 1
        self.lr, self.gnorm = stats.lr, stats.gnorm

    def flush(self) -> dict[str, float]:
        """The window's fields of a "train" record (all but update, epoch and wall); starts a new window."""
        seconds = time.perf_counter() - self.tic - self.excluded
        tokens = max(self.tokens, 1.0)
        loss, nll = float(self.loss), float(self.nll)  # the trainer's device sums are read here, at log time
        rec = {
            "loss": loss / tokens,
            "nll": nll / tokens,
            "ppl": math.exp(min(nll / tokens, 100.0)),
            "lr": self.lr,
            "gnorm": round(self.gnorm, 4),
            "tokens": int(self.tokens),
            "tokens_per_s": self.tokens / max(seconds, 1e-9),
            "updates_per_s": self.updates / max(seconds, 1e-9),
        }
        self.reset()
        return rec


def echo(msg: str) -> None:
    """A line on stderr that does not break a tqdm progress bar."""
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)
