#!/usr/bin/env bash
# Ctrl-C at a random moment of a run with ~10 s steps under mpirun, N times (issue 58's goal: a
# complete checkpoint in 10 of 10 tries). Each try: `tessera train` on 2 ranks (the small preset,
# grad_accum sized for ~10 s steps on this host), SIGINT to mpirun after a random 15-60 s, then
# `ckpt verify` of what latest names. Prints one line per try and "saved K of N".
#   bash benchmarks/interrupt_soak.sh [N=10] [WINDOW=30]   (needs build/bin/tessera; ~75 s a try)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TESSERA_BIN:-$ROOT/build/bin/tessera}
N=${1:-10} WINDOW=${2:-30}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$ROOT/tests/mpi/lib.bash"
$BIN init-model --preset small --seed 1 --out "$T/model" >/dev/null
saved=0
for i in $(seq 1 "$N"); do
  rm -rf "$T/ck" "$T/log"
  setsid "${MPIRUN[@]}" --mca odls_base_sigkill_timeout "$WINDOW" -np 2 "$BIN" train --set model.path="$T/model" \
    --set data.path=/usr/share/common-licenses --set data.tokenizer=bytes --set data.seq_len=128 \
    --set train.micro_batch=4 --set train.grad_accum="${ACCUM:-6}" --set train.steps=100000 --set log.every=1 \
    --set checkpoint.dir="$T/ck" --set checkpoint.every=100000 --set log.dir="$T/log" >"$T/out" 2>&1 &
  pid=$!
  at=$(python3 -c 'import random; print(round(random.uniform(15, 60), 1))')
  sleep "$at"
  kill -INT "$pid"
  start=$(date +%s.%N)
  wait "$pid"
  took=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  step_s=$(sed -n 's/^time per step (median of [0-9]*, \([0-9.]*\) s).*/\1/p' "$T/out" | tail -1)
  latest=$(cat "$T/ck/latest" 2>/dev/null || echo none)
  if [ "$latest" != none ] && $BIN ckpt verify "$T/ck/$latest" >/dev/null 2>&1; then
    saved=$((saved + 1)); verdict="saved $latest (verified)"
  else
    verdict="NOTHING SAVED"
  fi
  echo "try $i: SIGINT after ${at} s, median step ${step_s:-?} s: $verdict; mpirun ended ${took} s after SIGINT"
done
echo "saved $saved of $N"
