#!/usr/bin/env bash
# One English -> {German, French, Czech} model against three bilingual models of the same total budget, on Multi30k
# and 2 CPU cores, scored per direction on test_2016_flickr.
#
#   bash scripts/multi30k_multilingual.sh [--minutes M] [--from DIR] [--dry-run]
#     --minutes M  the multilingual run's training minutes (default 60, the bilingual recipe's hour); each bilingual
#                  run gets M/3, so both sides spend M minutes of the machine on the three directions
#     --from DIR   where Multi30k's files are (default ../shared/data/multi30k)
#     --dry-run    print the commands instead of running them
#
# Why the same total budget: a practitioner with one machine-hour for three directions chooses between one model
# for all of them and three models of 20 minutes each; that is the comparison this script makes. (Three bilingual
# runs of 60 minutes each would spend three times the machine.) Every run uses the bilingual recipe's model,
# optimiser and schedule (configs/multi30k_en_de.yaml; the multilingual config differs in its data and
# vocabulary), is scored with its checkpoint best on val BLEU (for the multilingual model, the mean over the three
# directions), beam 5 and lenpen 1.5 (the bilingual recipe's choice on val), and runs one after the other: two
# training jobs on 2 cores slow each other about tenfold. Prints a markdown table last.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
die() { echo "multi30k_multilingual.sh: $*" >&2; exit 2; }
minutes=60; from=../shared/data/multi30k; dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) [[ "${2:-}" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--minutes needs a number"; minutes="$2"; shift 2 ;;
    --from) [ -n "${2:-}" ] || die "--from needs a folder"; case "$2" in /*) from="$2" ;; *) from="$here/$2" ;; esac; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
tmt=.venv/bin/tmt
py=.venv/bin/python
run() { if [ "$dry" = 1 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }
third=$($py -c "print(f'{$minutes / 3:g}')")
data=data/multi30k
pairs=(de fr cs)

run scripts/prepare_multi30k.sh --from "$from" --langs "en de fr cs"

multi=runs/multi30k_multilingual
if [ ! -f "$multi/checkpoint_last.pt" ]; then
  run $tmt train --config configs/multi30k_multilingual.yaml --set train.out_dir="$multi" --set train.max_time="$minutes"
elif ! grep -q "stopped at update" "$multi/train.log"; then
  run $tmt train --resume "$multi"
fi
for tgt in "${pairs[@]}"; do
  bi=runs/multi30k_bi_en_$tgt
  if [ ! -f "$bi/checkpoint_last.pt" ]; then
    run $tmt train --config configs/multi30k_en_de.yaml --set train.out_dir="$bi" --set train.max_time="$third" \
      --set data.train_src=$data/train.en --set data.train_tgt=$data/train.$tgt \
      --set data.valid_src=$data/val.en --set data.valid_tgt=$data/val.$tgt
  elif ! grep -q "stopped at update" "$bi/train.log"; then
    run $tmt train --resume "$bi"
  fi
done

score() {  # CHECKPOINT TGT [--tgt-lang TGT]: cased sacreBLEU and chrF of test_2016_flickr, beam 5, lenpen 1.5
  local ckpt=$1 tgt=$2; shift 2
  $tmt evaluate -c "$ckpt" --src $data/test_2016_flickr.en --ref $data/test_2016_flickr."$tgt" --beam 5 --lenpen 1.5 \
    -o "$(dirname "$ckpt")/test_2016_flickr.$tgt" --json "$@" \
    | $py -c 'import json, sys; r = json.load(sys.stdin); print("%.1f | %.1f" % (r["bleu"], r["chrf"]))'
}
updates() { grep -o "stopped at update [0-9]*" "$1/train.log" | tail -1 | grep -o "[0-9]*$"; }
if [ "$dry" = 1 ]; then
  for tgt in "${pairs[@]}"; do
    run $tmt evaluate -c $multi/checkpoint_best.pt --src $data/test_2016_flickr.en --ref $data/test_2016_flickr.$tgt \
      --beam 5 --lenpen 1.5 --tgt-lang "$tgt" --json
    run $tmt evaluate -c runs/multi30k_bi_en_$tgt/checkpoint_best.pt --src $data/test_2016_flickr.en \
      --ref $data/test_2016_flickr.$tgt --beam 5 --lenpen 1.5 --json
  done
  exit 0
fi
echo
echo "test_2016_flickr, cased sacreBLEU / chrF, beam 5, lenpen 1.5, checkpoint best on val BLEU"
echo
echo "| direction | multilingual ($minutes min, $(updates $multi) updates): BLEU | chrF | bilingual ($third min each): BLEU | chrF | bilingual updates |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for tgt in "${pairs[@]}"; do
  bi=runs/multi30k_bi_en_$tgt
  echo "| en-$tgt | $(score $multi/checkpoint_best.pt "$tgt" --tgt-lang "$tgt") | $(score $bi/checkpoint_best.pt "$tgt") | $(updates "$bi") |"
done
