#!/usr/bin/env bash
# The one prepared run of a lent GPU, at most 8 minutes of wall time with its set-up: training of the paper's base
# and big models and of the recipe in bf16, eager against the cuda backend (tokens/s, MFU over the measured and the
# datasheet peak, peak memory, compiles); the cuda backend's losses against the reference backend's; greedy and
# beam-5 decoding of test_2016_flickr eager and graphed beside CTranslate2; the cuda-marked tests. The table is
# printed last (transformer_mt/benchmark/gpu_check.py says what each column is).
#
# 1. Here, once (the GPU machine reaches no network and gets no ../shared):
#      scripts/gpu_check.sh --prepare [CHECKPOINT]
#    copies Multi30k en-de and CHECKPOINT (a trained recipe model, optimizer state dropped; without one the run
#    decodes the model it trains for a few updates) into .gpu_check/, and CTranslate2's wheel into .whl/ (both
#    git-ignored through .git/info/exclude).
# 2. On the GPU machine, from the repository's root:
#      bash scripts/gpu_check.sh            (the device tool: carry .gpu_check and .whl)
#    writes everything under $OUT (else gpu_check_out/): benchmark.json, benchmark.md, the phases' logs.
#
# Options of the run: TMT_GPU_CHECK_ARGS adds benchmark options (e.g. "--time-budget 300"); on a CPU,
# TMT_GPU_CHECK_ARGS="--device cpu --quick" runs the same plan on tiny sizes (how the tests prove it).
set -uo pipefail
cd "$(dirname "$0")/.."
HERE=.gpu_check
PY=${PYTHON:-python3}  # the GPU machine's python3 holds torch; here, PYTHON=.venv/bin/python

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    data=${TMT_MULTI30K:-../shared/data/multi30k}
    mkdir -p "$HERE/multi30k" .whl
    for f in train val test_2016_flickr; do cp "$data/$f.en" "$data/$f.de" "$HERE/multi30k/"; done
    for d in /.gpu_check/ /.whl/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >>.git/info/exclude; done
    if [[ -n "${2:-}" ]]; then
        "$PY" - "$2" "$HERE/recipe.pt" <<'EOF'
import sys, torch
ckpt = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
ckpt.pop("optimizer", None)  # decoding needs the weights, config and tokenizers only
torch.save(ckpt, sys.argv[2])
EOF
    fi
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        -d .whl ctranslate2 || echo "gpu_check: no CTranslate2 wheel; its rows will say so"
    du -sh "$HERE" .whl
    exit 0
fi

OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
start=$SECONDS
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TMT_MULTI30K=$PWD/$HERE/multi30k
[[ -d $TMT_MULTI30K ]] || TMT_MULTI30K=$(cd ../shared/data/multi30k 2>/dev/null && pwd)
"$PY" -c "import torch; print('gpu_check: torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

# the cuda-marked tests first (bounded), so that the table is the last thing printed
timeout 75 "$PY" -m pytest -p no:cacheprovider -m cuda -x tests 2>&1 | tee "$OUT/cuda_tests.txt" | tail -3

checkpoint=()
[[ -f $HERE/recipe.pt ]] && checkpoint=(--checkpoint "$HERE/recipe.pt")
# shellcheck disable=SC2086 # TMT_GPU_CHECK_ARGS is a list of options
"$PY" -m transformer_mt.benchmark --gpu-check --device cuda --data "$TMT_MULTI30K" --out "$OUT/bench" \
    --warmup 8 --updates 30 --cuda-tests "$OUT/cuda_tests.txt" "${checkpoint[@]}" ${TMT_GPU_CHECK_ARGS:-} \
    2>"$OUT/benchmark.log"
status=$?
[[ $status -ne 0 ]] && tail -n 15 "$OUT/benchmark.log"
cp "$OUT/bench/benchmark.json" "$OUT/bench/benchmark.md" "$OUT/" 2>/dev/null
echo "gpu_check: $((SECONDS - start)) s in all; exit $status"
exit $status
