"""The benchmark: what it runs, how it times and counts, and how it reports. ``python -m transformer_mt.benchmark``
(or ``scripts/benchmark.py``, the same command) writes <out>/benchmark.json and <out>/benchmark.md.

Each phase runs in a fresh subprocess (:mod:`transformer_mt.benchmark.runner`), so the ``ru_maxrss`` it reports is
that phase's own peak resident memory (the Python interpreter and torch included):

  matmul     an n x n matmul in float32 and bfloat16: after 3 warm-up runs, the best of ``reps`` timed
             runs, GFLOP/s = 2 n^3 / seconds, at the start and again at the end of the run; the faster
             of the two is the machine's peak;
  train      ``tmt train``'s own loop (:class:`transformer_mt.training.Trainer`, fed through its
             ``on_update`` hook) on real Multi30k token-budget batches, for the recipe model (--config)
             and the reference model (3+3 layers, d_model 256, d_ff 1024, 4 heads, post-norm, shared
             embeddings, 4096-token batches), each in float32 and bfloat16 autocast: ``--warmup`` updates
             untimed, then ``--updates`` timed; tokens/s counts non-pad target tokens (pieces + EOS).
             Both models also train once more in float32 with "plain ops" (``F.dropout`` and the unfused
             logits + ``label_smoothed_nll_loss`` path: the reference backend, ``train.ops: reference``), the
             baseline of the CPU speed-ups, same batches;
  translate  :class:`transformer_mt.decoding.Translator` on test_2016_flickr.en, greedy and beam 5, at the
             checkpoint's ``decode.batch_tokens`` and ``decode.lenpen``, after an untimed warm-up on 8
             sentences; tokens/s counts generated tokens + EOS. Two models: the reference size
             (``--reference-checkpoint``, a trained 3+3/d256 model; the beam-5 speed compared with
             fairseq's is this one's) and the recipe model (``--checkpoint``, timed only when given).
             Without ``--reference-checkpoint`` the reference model is the one after the benchmark's few
             float32 updates: its outputs are too long and the speed is flagged ``"representative": false``.
  syncs      host-device synchronisations (:class:`transformer_mt.runtime.SyncCounter`, which counts on
             any device the ops that make a GPU's host wait): per training update of the recipe model in
             float32 (3 updates, on the phase's own fresh Trainer) and per search step of its (untrained)
             model, greedy and beam 5, at batches of 8 and 32 test sentences. The budgets: one per
             training update, one per search step whatever the batch size and beam;
  ctranslate2  with ``--ctranslate2`` (the ``export`` extra), after the others: tmt and CTranslate2 on each
             translated checkpoint (:mod:`transformer_mt.benchmark.ct2`);
  peer       with ``--peer fairseq``: tmt's train phase and then ``fairseq-train --cpu`` (in the side environment
             scripts/fairseq_env.sh makes) on one config and the same pairs, timed over the same updates;
             ``--only peer`` runs just these and the matmul peak (:mod:`transformer_mt.benchmark.peer`,
             :mod:`transformer_mt.benchmark.fairseq_side`).

FLOPs per target token (multiply-add = 2 FLOPs), counted two ways on the padded batches actually run:
  analytic   3 x forward (backward = 2 x forward) over every timed batch, by transformer_mt.runtime.forward_flops
             (the formula is in that module's docstring; the training cost report of `tmt train` uses it too);
  measured   torch.utils.flop_counter.FlopCounterMode over forward, loss and backward of a few timed batches
             spread over the window (:mod:`transformer_mt.benchmark.flops`), which checks the formula: the two
             agree batch for batch. The achieved GFLOP/s and the fraction of the matmul peak use the analytic
             count of every timed batch times the measured / analytic ratio of the sampled ones (1.0 when they
             agree): a few batches' own FLOPs per token move with their lengths and padding, and do not stand for
             the window.

The quoted reference figures (fairseq, OpenNMT-py, a matmul peak) were measured elsewhere; this benchmark
measures none of them (``--peer fairseq`` measures fairseq itself, in its own table). No number here is
meaningful on a busy machine: the load average at start and end is recorded to show it.

Modules, bottom to top: settings (sizes, reference model, quoted figures, GPU peaks); flops; specs (the
data and one phase's spec); phases, ct2, fairseq_side, peer (the phases); plan (the order of a run);
runner (one subprocess per phase); report (benchmark.json) and markdown (benchmark.md); cli.
"""

from transformer_mt.benchmark.cli import dry_run, main, parse_args, run_all
from transformer_mt.benchmark.ct2 import best_pass, phase_ctranslate2
from transformer_mt.benchmark.fairseq_side import (
    PeerError,
    parse_preprocess_log,
    peer_config,
    prepare,
    require_env,
    train_command,
    write_dictionary,
)
from transformer_mt.benchmark.flops import count_flops, train_step_flops
from transformer_mt.benchmark.markdown import render_markdown
from transformer_mt.benchmark.peer import parse_train_log, phase_fairseq
from transformer_mt.benchmark.phases import phase_matmul, phase_syncs, phase_train, phase_translate
from transformer_mt.benchmark.settings import gpu_bf16_peak

__all__ = [
    "PeerError",
    "best_pass",
    "count_flops",
    "dry_run",
    "gpu_bf16_peak",
    "main",
    "parse_args",
    "parse_preprocess_log",
    "parse_train_log",
    "peer_config",
    "phase_ctranslate2",
    "phase_fairseq",
    "phase_matmul",
    "phase_syncs",
    "phase_train",
    "phase_translate",
    "prepare",
    "render_markdown",
    "require_env",
    "run_all",
    "train_command",
    "train_step_flops",
    "write_dictionary",
]
