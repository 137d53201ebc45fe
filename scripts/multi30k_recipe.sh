#!/usr/bin/env bash
# The Multi30k en-de recipe end to end (issue 6): data, training (at most 60 minutes on CPU),
# averaging of the last 5 checkpoints, and scores on val and test_2016_flickr.
#
#   bash scripts/multi30k_recipe.sh [--from DIR] [--run DIR]
#     --from DIR  copy Multi30k from a folder (default: ../shared/data/multi30k if present, else download)
#     --run DIR   run directory (default runs/multi30k_en_de; an existing run there is resumed)
# Needs the project installed in .venv (see README). Prints cased and lowercased sacreBLEU and chrF.
set -euo pipefail
cd "$(dirname "$0")/.."
from=""; run=runs/multi30k_en_de
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="$2"; shift 2 ;;
    --run) run="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "multi30k_recipe.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
[ -z "$from" ] && [ -d ../shared/data/multi30k ] && from=../shared/data/multi30k
tmt=.venv/bin/tmt
if [ -n "$from" ]; then scripts/prepare_multi30k.sh --from "$from"; else scripts/prepare_multi30k.sh; fi

if [ -f "$run/checkpoint_last.pt" ]; then
  $tmt train --resume "$run"
else
  $tmt train --config configs/multi30k_en_de.yaml --set train.out_dir="$run"
fi
grep -E "stopped at update" "$run/train.log" | tail -1
$tmt average --run "$run" --last 5 -o "$run/checkpoint_avg.pt"

for split in val test_2016_flickr; do
  echo "== $split (averaged model, decode settings of the config)"
  $tmt evaluate -c "$run/checkpoint_avg.pt" --src data/multi30k/$split.en --ref data/multi30k/$split.de -o "$run/$split.hyp.de"
  echo "-- lowercased"
  $tmt bleu --ref data/multi30k/$split.de "$run/$split.hyp.de" --lowercase
done
