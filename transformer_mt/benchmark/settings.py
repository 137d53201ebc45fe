"""What the benchmark measures and against what: run sizes, the reference model, quoted figures, GPU peaks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCHEMA = "transformer_mt.benchmark/1"
RECIPE_CONFIG, FALLBACK_CONFIG = REPO / "configs" / "multi30k_en_de.yaml", REPO / "configs" / "multi30k_small.yaml"
DTYPES = ("float32", "bfloat16")

REFERENCE_MODEL: dict[str, Any] = dict(
    encoder_layers=3,
    decoder_layers=3,
    d_model=256,
    heads=4,
    d_ff=1024,
    dropout=0.1,
    norm="post",
    share_all_embeddings=True,
)
# The reference model's vocabulary: a joint unigram model of 8,000 pieces whatever the recipe uses, so its
# output layer (a large share of a small model's FLOPs) stays the same from one recipe to the next.
REFERENCE_VOCAB = 8000
# The reference model's optimiser: multi30k_small.yaml's schedule, so the few benchmark updates move the weights.
REFERENCE_TRAIN: dict[str, Any] = dict(
    max_tokens=4096, update_freq=1, label_smoothing=0.1, lr_schedule="inverse_sqrt", lr=1e-3, warmup_updates=400
)

# Figures of other toolkits on the reference setting, measured on other machines and never by this script:
# the speed targets were set against them. A ratio to them is no side-by-side measurement (--peer fairseq is).
QUOTED = {
    "source": "quoted, measured elsewhere (the figures the speed targets were set against); "
    "not measured by this script",
    "setting": "3+3 layers, d_model 256, d_ff 1024, 4 heads, post-norm, shared embeddings, float32, 2 threads, "
    "4096-token batches",
    "train_tokens_per_s": {"fairseq 0.12.2": 1570, "OpenNMT-py 3.5.1": 1200},
    "beam5_sentences_per_s": {"fairseq-generate": 20, "OpenNMT-py": "30-39"},
    "matmul_peak_gflops": {"float32": 134, "bfloat16": 376},
    "targets": {"train_tokens_per_s": "1.5 x 1,570 (fairseq, the faster)", "beam5_sentences_per_s": "3 x 20 (fairseq)"},
}
TRAIN_QUOTED, TRAIN_TARGET, BEAM5_QUOTED, BEAM5_TARGET = 1570.0, 1.5, 20.0, 3.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What a full run and a --quick run (seconds, tiny models, same schema) measure."""

    # Untimed updates per training run (--warmup). A run's first ~20 updates each meet new batch shapes: the heap grows
    # (thousands of page faults an update, about 40 once it has settled) and oneDNN builds kernels for new row counts.
    # The hour's rate is the settled one.
    warmup: int = 20
    updates: int = 60  # timed updates per training run (--updates)
    matmul_n: int = 2048  # side of the square matmul timed for the peak
    matmul_reps: int = 10  # timed matmuls per dtype (the best one is the peak)
    sentences: int = 0  # test sentences translated (--sentences); 0 = all
    flop_batches: int = 3  # timed batches run again under FlopCounterMode
    train_lines: int = 0  # training pairs used; 0 = all (spm and the batches see only these)
    spm_vocab: int = 0  # sentencepiece vocabulary; 0 = the recipe's tokenizer.vocab_size
    model: tuple = ()  # model.* overrides for both models (quick: tiny)
    max_tokens: int = 0  # batch budget for both models; 0 = recipe's / 4096


FULL = Sizes()
QUICK = Sizes(
    warmup=1,
    updates=2,
    matmul_n=256,
    matmul_reps=3,
    sentences=20,
    flop_batches=1,
    train_lines=2000,
    spm_vocab=1000,
    model=(("encoder_layers", 1), ("decoder_layers", 1), ("d_model", 32), ("heads", 2), ("d_ff", 64)),
    max_tokens=512,
)
# --device cuda: more updates (a GPU update takes milliseconds), the GPU's matmul size, FLOPs by the formula only.
FULL_CUDA = dataclasses.replace(FULL, warmup=10, updates=50, matmul_n=8192, flop_batches=0)
QUICK_CUDA = dataclasses.replace(QUICK, flop_batches=0)


def sizes_for(*, device: str, quick: bool) -> Sizes:
    if device == "cuda":
        return QUICK_CUDA if quick else FULL_CUDA
    return QUICK if quick else FULL


GPU_BATCH_TOKENS = 25000  # the paper's ~25k source + 25k target tokens per update, in one batch (section 5.1)
# Dense (no sparsity) bfloat16 tensor-core peaks in TFLOP/s from NVIDIA's datasheets, the denominator of MFU:
# quoted, not measured. The first pattern in torch.cuda.get_device_name() wins (specific names first);
# an unlisted GPU gets its measured bfloat16 matmul peak instead (or --peak-tflops).
GPU_BF16_PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.5),
    ("H200 NVL", 835.5),
    ("H100", 989.5),
    ("H200", 989.5),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


def gpu_bf16_peak(name: str, measured_gflops: float, override_tflops: float = 0.0) -> tuple[float, str]:
    """(FLOP/s, source) of the bfloat16 dense peak MFU is measured against."""
    if override_tflops > 0:
        return override_tflops * 1e12, "--peak-tflops"
    for pattern, tflops in GPU_BF16_PEAK_TFLOPS:
        if pattern in name:
            return tflops * 1e12, f"datasheet bf16 dense peak of {pattern} (quoted, not measured)"
    return measured_gflops * 1e9, "measured bf16 matmul peak (GPU not in the datasheet table)"
