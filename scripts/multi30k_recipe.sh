#!/usr/bin/env bash
# The Multi30k en-de recipe end to end (issue 6): data, training (at most 60 minutes on CPU), the
# decoding choices made on val only, then scores on test_2016_flickr.
#
#   bash scripts/multi30k_recipe.sh [--from DIR] [--run DIR] [--config FILE] [--data DIR]
#     --from DIR     copy Multi30k from a folder (default: ../shared/data/multi30k if present, else download)
#     --data DIR     train, choose and score on DIR/{train,val,test_2016_flickr}.{en,de} instead of the
#                    copy in data/multi30k (e.g. a preprocessed copy; scores are against DIR's references;
#                    a resumed run keeps the data it started with, so pass the same DIR again)
#     --run DIR      run directory (default runs/multi30k_en_de; an existing run there is resumed,
#                    a finished one goes straight to the evaluation)
#     --config FILE  training config (default configs/multi30k_en_de.yaml)
# Needs the project installed in .venv (see README). Chooses, by cased BLEU on val with beam 5, among
# the last checkpoint, the averages of the last 4 and 8 numbered checkpoints and the ensemble of the
# last 4, each with lenpen 0.6, 1.0 and 1.5; then prints cased and lowercased sacreBLEU and chrF of
# that choice on val and test.
set -euo pipefail
cd "$(dirname "$0")/.."
from=""; run=runs/multi30k_en_de; config=configs/multi30k_en_de.yaml; data=data/multi30k
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="$2"; shift 2 ;;
    --run) run="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --data) data="${2%/}"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "multi30k_recipe.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
[ -z "$from" ] && [ -d ../shared/data/multi30k ] && from=../shared/data/multi30k
tmt=.venv/bin/tmt
py=.venv/bin/python
if [ -n "$from" ]; then scripts/prepare_multi30k.sh --from "$from"; else scripts/prepare_multi30k.sh; fi

if [ -f "$run/checkpoint_last.pt" ]; then
  grep -q "stopped at update" "$run/train.log" || $tmt train --resume "$run"
else
  $tmt train --config "$config" --set train.out_dir="$run" \
    --set data.train_src="$data/train.en" --set data.train_tgt="$data/train.de" \
    --set data.valid_src="$data/val.en" --set data.valid_tgt="$data/val.de"
fi
grep -E "stopped at update" "$run/train.log" | tail -1

# Candidates: the last checkpoint, the averages of the newest 4 and 8 numbered checkpoints, and the
# ensemble of the newest 4 (their mean probability at every step; 4x slower to decode). Each is a
# list of -c arguments (paths without spaces).
names=(last); models=("-c $run/checkpoint_last.pt")
numbered=$(ls "$run"/checkpoint_[0-9]*.pt 2>/dev/null | wc -l)
for n in 4 8; do
  if [ "$numbered" -ge "$n" ]; then
    $tmt average --run "$run" --last "$n" -o "$run/checkpoint_avg$n.pt" >/dev/null
    names+=("avg$n"); models+=("-c $run/checkpoint_avg$n.pt")
  fi
done
if [ "$numbered" -ge 4 ]; then
  names+=(ens4)
  models+=("$($py -c "from transformer_mt.checkpoint import last_checkpoints; print(' '.join(f'-c {p}' for p in last_checkpoints('$run', 4)))")")
fi

echo "== choosing on val (cased BLEU, beam 5)"
mkdir -p "$run/eval"
best=-1; best_bleu=-1
for i in "${!names[@]}"; do
  for lenpen in 0.6 1.0 1.5; do
    # shellcheck disable=SC2086 # models[i] is a list of -c arguments
    bleu=$($tmt evaluate ${models[$i]} --src "$data/val.en" --ref "$data/val.de" --beam 5 --lenpen "$lenpen" \
             -o "$run/eval/val.${names[$i]}.lp$lenpen.de" --json | $py -c 'import json, sys; print(json.load(sys.stdin)["bleu"])')
    echo "  ${names[$i]} lenpen $lenpen: val BLEU $bleu"
    if $py -c "import sys; sys.exit(0 if float('$bleu') > float('$best_bleu') else 1)"; then
      best=$i; best_lenpen=$lenpen; best_bleu=$bleu
    fi
  done
done
echo "== chosen: ${names[$best]} ($(echo ${models[$best]} | sed 's/-c //g')) lenpen $best_lenpen (val BLEU $best_bleu)"

for split in val test_2016_flickr; do
  hyp="$run/eval/$split.hyp.de"
  echo "== $split: ${names[$best]}, beam 5, lenpen $best_lenpen"
  # shellcheck disable=SC2086
  $tmt evaluate ${models[$best]} --src "$data/$split.en" --ref "$data/$split.de" --beam 5 --lenpen "$best_lenpen" -o "$hyp"
  echo "-- lowercased"
  $tmt bleu --ref "$data/$split.de" "$hyp" --lowercase
done
