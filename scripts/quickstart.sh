#!/usr/bin/env bash
# The main job end to end on a fresh machine: create .venv, install, get Multi30k en-de,
# train a small Transformer for a few minutes (tokenizer included), translate the test set
# with beam search and print its BLEU.
#
#   bash scripts/quickstart.sh [--from DIR] [--minutes M] [--config FILE]
#     --from DIR     copy Multi30k from a folder (default: ../shared/data/multi30k if it exists, else download)
#     --minutes M    training time limit in minutes (default 5)
#     --config FILE  training config (default configs/multi30k_small.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."

from=""; minutes=5; config=configs/multi30k_small.yaml
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "quickstart.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
[ -z "$from" ] && [ -d ../shared/data/multi30k ] && from=../shared/data/multi30k

# 1. environment (torch first: 2.13.0 is the CPU build; see README for CUDA)
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[dev]"

# 2. data
if [ -n "$from" ]; then scripts/prepare_multi30k.sh --from "$from"; else scripts/prepare_multi30k.sh; fi

# 3. train (the sentencepiece model is trained first, into the run directory)
run=runs/quickstart
rm -rf "$run"
.venv/bin/tmt train --config "$config" --set train.out_dir="$run" --set train.max_time="$minutes"

# 4. translate the test set with beam search and score it
.venv/bin/tmt translate --checkpoint "$run/checkpoint_best.pt" data/multi30k/test_2016_flickr.en -o "$run/test.hyp.de"
.venv/bin/tmt bleu --ref data/multi30k/test_2016_flickr.de "$run/test.hyp.de"
