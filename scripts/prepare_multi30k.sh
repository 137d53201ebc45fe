#!/usr/bin/env bash
# Lay out Multi30k (Task 1, raw text) for a language pair where the recipe expects it:
#   data/multi30k/{train,val,test_2016_flickr}.{XX,YY} (by default en and de)
#
# Usage:
#   scripts/prepare_multi30k.sh [--from DIR] [--out DIR] [--langs "en de"]
#     --from DIR   copy the files from a local folder (e.g. ../shared/data/multi30k)
#                  instead of downloading them from the public repository
#     --out DIR    where to put them (default: data/multi30k)
#     --langs      which sides to get (default: "en de"; the dataset also has fr and cs)
# Without --from it downloads the gzipped raw files from github.com/multi30k/dataset.
set -euo pipefail

src=""; out="data/multi30k"; langs="en de"
while [ $# -gt 0 ]; do
  case "$1" in
    --from) src="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --langs) langs="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "prepare_multi30k.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done

url="https://github.com/multi30k/dataset/raw/master/data/task1/raw"
mkdir -p "$out"
for split in train val test_2016_flickr; do
  for lang in $langs; do
    name="$split.$lang"
    if [ -n "$src" ]; then
      if [ -f "$src/$name" ]; then cp "$src/$name" "$out/$name"
      elif [ -f "$src/$name.gz" ]; then gunzip -c "$src/$name.gz" > "$out/$name"
      else echo "prepare_multi30k.sh: $src/$name not found; point --from at the folder holding the raw Multi30k files" >&2; exit 1
      fi
    else
      tmp="$out/.$name.gz.part"
      if ! curl -fsSL --retry 3 -o "$tmp" "$url/$name.gz"; then
        rm -f "$tmp"
        echo "prepare_multi30k.sh: could not download $url/$name.gz; check the network or use --from DIR" >&2; exit 1
      fi
      gunzip -c "$tmp" > "$out/$name"; rm -f "$tmp"
    fi
  done
  first=$(set -- $langs; echo "$1")
  n=$(wc -l < "$out/$split.$first")
  for lang in $langs; do
    m=$(wc -l < "$out/$split.$lang")
    [ "$m" = "$n" ] || { echo "prepare_multi30k.sh: $out/$split.$lang has $m lines but $out/$split.$first has $n" >&2; exit 1; }
  done
  echo "$out/$split.{${langs// /,}}: $n pairs" >&2
done
