#!/usr/bin/env bash
# Create the fairseq side environment that `scripts/benchmark.py --peer fairseq` trains the peer in.
#
#   scripts/fairseq_env.sh [DIR]        DIR default: $FAIRSEQ_ENV, else .venv-fairseq in the repo root
#
# fairseq 0.12.2's sdist no longer builds; the fork fairseq-fixed 0.12.3.1 does, against the CPU torch we pin,
# when installed without its declared dependencies (they pull another torch and torchaudio) and without build
# isolation (its extensions compile against this environment's torch, numpy and Cython). Only what
# `fairseq-preprocess` and `fairseq-train` import is installed, each pinned. Re-running skips every step that is
# already done; each step prints one line, a failure one line naming the step and its log.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${1:-${FAIRSEQ_ENV:-$REPO/.venv-fairseq}}"
PY="$ENV_DIR/bin/python"
LOG="$ENV_DIR/install.log"

TORCH="torch==2.13.0"  # the project's torch (CPU build); never unpinned
BUILD=(setuptools==84.2.1 cython==3.3.1 numpy==2.4.6)  # what fairseq-fixed's setup.py compiles with
FAIRSEQ="fairseq-fixed==0.12.3.1"
RUNTIME=(hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 regex==2026.11.15 sacrebleu==2.6.0 scikit-learn==1.9.1
         tqdm==4.70.1)  # tqdm: fairseq.models.speech_dlm imports it when fairseq-train starts

say() { echo "fairseq_env: $*"; }
fail() { echo "fairseq_env: error: $1 failed; see $LOG (delete $ENV_DIR to start over)" >&2; exit 1; }
has() { "$PY" - "$@" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(any(version(name).split("+")[0] != want for name, want in (a.split("==") for a in sys.argv[1:])))
EOF
}

if [[ -x "$PY" ]]; then
  say "venv $ENV_DIR: present, skipped"
else
  mkdir -p "$(dirname "$ENV_DIR")"
  python3 -m venv "$ENV_DIR" >/dev/null 2>&1 || { echo "fairseq_env: error: python3 -m venv $ENV_DIR failed (is python3-venv installed?)" >&2; exit 1; }
  say "venv $ENV_DIR: created ($("$PY" --version 2>&1))"
fi
: >>"$LOG"
pip() { "$PY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; }

step() {  # step NAME PIP-ARGS... : install unless every NAME==VERSION among the pinned args is already there
  local name="$1"; shift
  local pins=(); for a in "$@"; do [[ "$a" == *==* ]] && pins+=("$a"); done
  if has "${pins[@]}"; then say "$name: present, skipped"; return; fi
  pip "$@" || fail "$name (pip install $*)"
  say "$name: installed"
}

step "torch (CPU)" "$TORCH"
step "build tools" "${BUILD[@]}"
step "fairseq" "$FAIRSEQ" --no-deps --no-build-isolation
step "fairseq runtime dependencies" "${RUNTIME[@]}"
"$ENV_DIR/bin/fairseq-train" --help >>"$LOG" 2>&1 || fail "the check 'fairseq-train --help'"
"$ENV_DIR/bin/fairseq-preprocess" --help >>"$LOG" 2>&1 || fail "the check 'fairseq-preprocess --help'"
say "check: fairseq-train and fairseq-preprocess --help run; ready ($ENV_DIR)"
