#!/usr/bin/env bash
# The Multi30k recipe end to end, for any language pair: data, training (at most 60 minutes
# on CPU), the decoding choices made on val only, then scores on the test sets.
#
#   bash scripts/multi30k_recipe.sh [--src XX --tgt YY] [--from DIR | --data DIR] [--run DIR] [--config FILE]
#                                   [--set SECTION.KEY=VALUE ...] [--dry-run]
#     --src XX, --tgt YY  the pair, as file suffixes (default en -> de; Multi30k also has fr and cs)
#     --from DIR     copy Multi30k's XX and YY files from a folder into data/multi30k
#                    (default: ../shared/data/multi30k if present, else download)
#     --data DIR     any corpus instead: DIR/train.XX, train.YY, val.XX, val.YY, and each DIR/test*.XX with its
#                    DIR/test*.YY is scored; nothing is copied or downloaded (a resumed run keeps the data it
#                    started with, so pass the same DIR again)
#     --run DIR      run directory (default runs/<data folder>_XX_YY; an existing run there is resumed,
#                    a finished one goes straight to the evaluation)
#     --config FILE  training config (default configs/multi30k_en_de.yaml: nothing in it depends on the pair;
#                    its data.* are replaced by the files above)
#     --set S.K=V    override one training config value, as tmt train --set (repeatable; e.g. a candidate of the
#                    re-tune: --set train.ema_decay=0.999); ignored when an existing run is resumed
#     --dry-run      print the commands instead of running them (CHOSEN: what the choice on val picks)
# Needs the project installed in .venv (see README). Chooses, by cased BLEU on val with beam 5, among
# the last checkpoint, the averages of the last 4 and 8 numbered checkpoints, the ensemble of the
# last 4 and, when the run kept spaced checkpoints (train.keep_every=K), the LAWA average of the 4
# newest multiples of K, each with lenpen 0.6, 1.0 and 1.5; then prints cased and lowercased sacreBLEU
# and chrF of that choice on val and the test sets.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
die() { echo "multi30k_recipe.sh: $*" >&2; exit 2; }
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }  # user paths are relative to where the script was called
src=en; tgt=de; from=""; data=""; run=""; config=configs/multi30k_en_de.yaml; dry=0; sets=(); overrides=()
while [ $# -gt 0 ]; do
  case "$1" in --src|--tgt|--from|--data|--run|--config|--set) [ $# -ge 2 ] && [ "${2#--}" = "$2" ] || die "$1 needs a value; see --help" ;; esac
  case "$1" in
    --src) src="$2"; shift 2 ;;
    --tgt) tgt="$2"; shift 2 ;;
    --from) from=$(abs "$2"); shift 2 ;;
    --data) data=$(abs "${2%/}"); shift 2 ;;
    --run) run=$(abs "$2"); shift 2 ;;
    --config) config=$(abs "$2"); shift 2 ;;
    --set) [[ "$2" =~ ^[a-z_]+\.[a-z_0-9]+=. ]] || die "--set '$2': give SECTION.KEY=VALUE, e.g. train.ema_decay=0.999"
           sets+=(--set "$2"); overrides+=("$2"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
for lang in "$src" "$tgt"; do [[ "$lang" =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]] || die "--src/--tgt '$lang': give a file suffix such as fr or pt_br"; done
[ "$src" != "$tgt" ] || die "--src and --tgt are both '$src'; give two languages"
[ -z "$from" ] || [ -z "$data" ] || die "--from copies Multi30k, --data uses your own files; give one of them"
[ -f "$config" ] || die "--config $config: file not found"
tmt=.venv/bin/tmt
py=.venv/bin/python
run() { if [ "$dry" = 1 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }  # a command, or with --dry-run its line

# 1. data: Multi30k laid out in data/multi30k, or the given corpus as it is
if [ -z "$data" ]; then
  data=data/multi30k
  [ -z "$from" ] && [ -d ../shared/data/multi30k ] && from=../shared/data/multi30k
  if [ -n "$from" ]; then run scripts/prepare_multi30k.sh --from "$from" --langs "$src $tgt"
  else run scripts/prepare_multi30k.sh --langs "$src $tgt"; fi
  tests=(test_2016_flickr)  # what prepare_multi30k.sh lays out
else
  for f in train."$src" train."$tgt" val."$src" val."$tgt"; do [ -f "$data/$f" ] || die "--data $data: $data/$f not found"; done
  tests=()
  for f in "$data"/test*."$src"; do
    [ -f "$f" ] || continue
    name=$(basename "$f" ".$src")
    if [ -f "$data/$name.$tgt" ]; then tests+=("$name"); else echo "multi30k_recipe.sh: $f has no $data/$name.$tgt; not scored" >&2; fi
  done
  [ ${#tests[@]} -gt 0 ] || echo "multi30k_recipe.sh: no $data/test*.$src with its .$tgt; scoring val only" >&2
fi
[ -n "$run" ] || run=runs/$(basename "$data")_${src}_${tgt}

# 2. training (the sentencepiece model is trained first, into the run directory)
if [ -f "$run/checkpoint_last.pt" ]; then
  grep -q "stopped at update" "$run/train.log" || run $tmt train --resume "$run"
else
  run $tmt train --config "$config" --set train.out_dir="$run" ${sets[@]+"${sets[@]}"} \
    --set data.train_src="$data/train.$src" --set data.train_tgt="$data/train.$tgt" \
    --set data.valid_src="$data/val.$src" --set data.valid_tgt="$data/val.$tgt"
fi
[ "$dry" = 1 ] || grep -E "stopped at update" "$run/train.log" | tail -1

# 3. candidates: the last checkpoint, the averages of the newest 4 and 8 numbered checkpoints, and the
# ensemble of the newest 4 (their mean probability at every step; 4x slower to decode). Each is a
# list of -c arguments (paths without spaces). A dry run lists them all.
names=(last); models=("-c $run/checkpoint_last.pt")
numbered=$( (ls "$run"/checkpoint_[0-9]*.pt 2>/dev/null || true) | wc -l)
[ "$dry" = 1 ] && numbered=8
for n in 4 8; do
  if [ "$numbered" -ge "$n" ]; then
    if [ "$dry" = 1 ]; then run $tmt average --run "$run" --last "$n" -o "$run/checkpoint_avg$n.pt"
    else $tmt average --run "$run" --last "$n" -o "$run/checkpoint_avg$n.pt" >/dev/null; fi
    names+=("avg$n"); models+=("-c $run/checkpoint_avg$n.pt")
  fi
done
if [ "$numbered" -ge 4 ]; then
  names+=(ens4)
  if [ "$dry" = 1 ]; then models+=("-c $run/NEWEST1.pt -c $run/NEWEST2.pt -c $run/NEWEST3.pt -c $run/NEWEST4.pt")
  else models+=("$($py -c "from transformer_mt.checkpoint import last_checkpoints; print(' '.join(f'-c {p}' for p in last_checkpoints('$run', 4)))")"); fi
fi
# LAWA: with train.keep_every=K, the average of the 4 newest checkpoints at multiples of K, a wider
# window than the newest 4 or 8 (read from the run's saved config; a dry run reads --config and --set)
# (the saved config already holds the --set values it was trained with; on a resume they are ignored, as above)
if [ -f "$run/config.yaml" ]; then cfg_args=("$run/config.yaml")
elif [ "$dry" = 1 ]; then cfg_args=("$config" ${overrides[@]+"${overrides[@]}"})
else die "$run/config.yaml not found; the run did not start"; fi
keep_every=$($py -c 'import sys
from transformer_mt.config import ConfigError, load_config
try:
    print(load_config(sys.argv[1], sys.argv[2:], check_files=False).train.keep_every)
except ConfigError as exc:
    sys.exit(f"multi30k_recipe.sh: {exc}")' "${cfg_args[@]}") || exit 2
if [ "$keep_every" -gt 0 ]; then
  if [ "$dry" = 1 ]; then run $tmt average --run "$run" --every "$keep_every" --last 4 -o "$run/checkpoint_lawa4.pt"
    names+=(lawa4); models+=("-c $run/checkpoint_lawa4.pt")
  elif $tmt average --run "$run" --every "$keep_every" --last 4 -o "$run/checkpoint_lawa4.pt" >/dev/null; then
    names+=(lawa4); models+=("-c $run/checkpoint_lawa4.pt")
  fi  # fewer than 4 kept multiples: tmt average has said so in one line; the other candidates go on
fi

# 4. the choice on val (cased BLEU, beam 5)
echo "== choosing on val (cased BLEU, beam 5)"
[ "$dry" = 1 ] || mkdir -p "$run/eval"
best=-1; best_bleu=-1; best_lenpen=""
for i in "${!names[@]}"; do
  for lenpen in 0.6 1.0 1.5; do
    # shellcheck disable=SC2086 # models[i] is a list of -c arguments
    args=(${models[$i]} --src "$data/val.$src" --ref "$data/val.$tgt" --beam 5 --lenpen "$lenpen" -o "$run/eval/val.${names[$i]}.lp$lenpen.$tgt" --json)
    if [ "$dry" = 1 ]; then run $tmt evaluate "${args[@]}"; continue; fi
    bleu=$($tmt evaluate "${args[@]}" | $py -c 'import json, sys; print(json.load(sys.stdin)["bleu"])')
    echo "  ${names[$i]} lenpen $lenpen: val BLEU $bleu"
    if $py -c "import sys; sys.exit(0 if float('$bleu') > float('$best_bleu') else 1)"; then
      best=$i; best_lenpen=$lenpen; best_bleu=$bleu
    fi
  done
done
if [ "$dry" = 1 ]; then chosen="-c CHOSEN"; best_lenpen=CHOSEN; label=CHOSEN
else chosen=${models[$best]}; label=${names[$best]}
  echo "== chosen: $label ($(echo "$chosen" | sed 's/-c //g')) lenpen $best_lenpen (val BLEU $best_bleu)"; fi

# 5. scores of the choice on val and on each test set
for split in val ${tests[@]+"${tests[@]}"}; do  # (an empty array is "unbound" to set -u before bash 4.4)
  hyp="$run/eval/$split.hyp.$tgt"
  echo "== $split: $label, beam 5, lenpen $best_lenpen"
  # shellcheck disable=SC2086
  run $tmt evaluate $chosen --src "$data/$split.$src" --ref "$data/$split.$tgt" --beam 5 --lenpen "$best_lenpen" -o "$hyp"
  echo "-- lowercased"
  run $tmt bleu --ref "$data/$split.$tgt" "$hyp" --lowercase
done
