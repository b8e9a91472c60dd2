#!/usr/bin/env bash
# Crash safety of sharded checkpoint saves: 2 MPI ranks save in a loop (sync and async) and are
# SIGKILLed at a random moment — one rank, or every rank and mpirun. Afterwards latest() must name a
# complete checkpoint that passes verify and holds exactly the values of its step (the
# CheckpointCrash.* tests of tests/mpi/test_checkpoint_mpi.cpp, in the mpi_tests binary, do the saving and the checking).
set -u
BIN=${TESSERA_BIN:?TESSERA_BIN must point at the build bin/ directory}
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
work=$(mktemp -d /tmp/tessera-ckpt-crash-XXXXXX)
trap 'rm -rf "$work"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # fail
on_fail() { tail -20 "$work/loop.log" 2>/dev/null; }

for round in 1 2 3 4 5 6 7 8; do
  mode=$([ $((round % 2)) -eq 1 ] && echo one || echo all)
  async=$([ "$round" -gt 4 ] && echo 1 || echo "")
  rm -f "$work/ready"
  env TESSERA_CKPT_CRASH_DIR="$work" TESSERA_CKPT_CRASH_FIRST_STEP=$((round * 1000)) ${async:+TESSERA_CKPT_CRASH_ASYNC=1} \
    "${MPIRUN[@]}" -x TESSERA_CKPT_CRASH_DIR -x TESSERA_CKPT_CRASH_FIRST_STEP ${async:+-x TESSERA_CKPT_CRASH_ASYNC} \
    -np 2 "$BIN/mpi_tests" --gtest_filter=CheckpointCrash.SaveLoop >"$work/loop.log" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do [ -f "$work/ready" ] && break; sleep 0.1; done
  [ -f "$work/ready" ] || fail "round $round: the save loop never completed a checkpoint"
  sleep "0.$(printf '%02d' $((RANDOM % 80 + 5)))"
  ranks=$(pgrep -P "$launcher" -f mpi_tests)
  [ -n "$ranks" ] || fail "round $round: no rank processes found under mpirun ($launcher)"
  if [ "$mode" = one ]; then
    kill -9 $(echo "$ranks" | head -1)
  else
    kill -9 $ranks "$launcher"
  fi
  wait "$launcher" 2>/dev/null
  pkill -9 -P "$launcher" 2>/dev/null  # leftovers of this launcher only
  latest=$(ls -d "$work"/ckpt/step-* 2>/dev/null | tr '\n' ' ')
  echo "round $round (kill $mode${async:+, async}): directories: $latest"
  "${MPIRUN[@]}" -x TESSERA_CKPT_CRASH_DIR="$work" -np 1 "$BIN/mpi_tests" \
    --gtest_filter=CheckpointCrash.VerifyLatest >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "round $round: latest checkpoint is not valid"; }
  grep "latest complete checkpoint" "$work/verify.log"
done
echo "PASS: every kill left a complete, verified latest checkpoint"
