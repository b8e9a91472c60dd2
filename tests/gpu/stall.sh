#!/usr/bin/env bash
# One rank stalled mid-training: every rank must end within comm.timeout_s plus slack, non-zero,
# with a one-line error naming the rank, the host and (on a GPU) the device. Used by tests/gpu/run.sh
# with two GPUs (NCCL watchdog); runs on CPU ranks too (MPI backend) where comm.timeout_s applies.
#
#   stall.sh TESSERA_BIN CORPUS WORKDIR DEVICE [TIMEOUT_S]     (DEVICE: cuda or cpu)
#
# Starts `mpirun -np 2 tessera train` on the tiny preset, waits until steps are being logged, stops
# rank 1 with SIGSTOP, and times how long mpirun takes to end. MPI starts as tests/gpu/run.sh does
# (mpi_local_env: no ssh needed).
set -uo pipefail
BIN=$1 CORPUS=$2 DIR=$3 DEVICE=$4 TIMEOUT_S=${5:-10}
SLACK_S=10
source "$(dirname "${BASH_SOURCE[0]}")/deps.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail, check
mpi_local_env
rm -rf "$DIR" && mkdir -p "$DIR"
mpirun --oversubscribe --bind-to none -np 2 -x LD_LIBRARY_PATH -x NCCL_DEBUG "$BIN" train \
  --set train.device="$DEVICE" --set model.preset=tiny --set train.steps=100000 --set train.micro_batch=1 \
  --set data.path="$CORPUS" --set data.tokenizer=bytes --set data.seq_len=64 --set log.dir="$DIR/log" --set comm.timeout_s="$TIMEOUT_S" \
  >"$DIR/out.log" 2>&1 &
MPIRUN_PID=$!
logged() { if [[ -f $DIR/log/metrics.jsonl ]]; then wc -l <"$DIR/log/metrics.jsonl"; else echo 0; fi; }
ranks() {  # pids of this run's ranks: this binary, writing into this log dir
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == "$(readlink -f "$BIN")" ]] &&
      tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "log.dir=$DIR/log" && echo "${p#/proc/}"
  done
}
on_fail() {  # tests/expect.bash's fail calls it
  kill -KILL "$MPIRUN_PID" $(ranks) 2>/dev/null
  tail -n 5 "$DIR/out.log"
}

# Training is under way once 3 steps are logged (60 s at most: model set-up and NCCL init included).
for _ in $(seq 600); do
  (($(logged) >= 3)) && break
  kill -0 "$MPIRUN_PID" 2>/dev/null || fail "mpirun ended before 3 steps were logged"
  sleep 0.1
done
(($(logged) >= 3)) || fail "no 3 logged steps within 60 s"
RANK1=""
for p in $(ranks); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && RANK1=$p
done
[[ -n $RANK1 ]] || fail "rank 1's process not found"
kill -STOP "$RANK1"
T0=$(date +%s%N)
echo "stall: rank 1 (pid $RANK1) stopped after $(logged) logged steps; comm.timeout_s=$TIMEOUT_S"
for _ in $(seq $(((TIMEOUT_S + SLACK_S + 30) * 10))); do
  kill -0 "$MPIRUN_PID" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$MPIRUN_PID" 2>/dev/null && fail "mpirun still running $((TIMEOUT_S + SLACK_S + 30)) s after the stall"
wait "$MPIRUN_PID"
RC=$?
ELAPSED_MS=$((($(date +%s%N) - T0) / 1000000))
ELAPSED=$((ELAPSED_MS / 1000)).$(printf %03d $((ELAPSED_MS % 1000)))
kill -KILL $(ranks) 2>/dev/null
echo "stall: mpirun ended with exit code $RC, ${ELAPSED}s after the stall (limit $TIMEOUT_S + $SLACK_S s)"
ERR=$(grep -m1 'tessera: error' "$DIR/out.log")
echo "stall: first error line: $ERR"
check "mpirun exits non-zero (exit code $RC)" test "$RC" -ne 0
check "mpirun ends within timeout + slack (${ELAPSED}s)" test "$ELAPSED_MS" -le $(((TIMEOUT_S + SLACK_S) * 1000))
for needle in "rank 0" "host $(hostname)" "within ${TIMEOUT_S}s"; do
  check "the error line names '$needle'" grep -qF -- "$needle" <<<"$ERR"
done
[[ $DEVICE != cuda* ]] || check "the error line names the device" grep -qF -- "device cuda:0" <<<"$ERR"
echo "stall: PASS ($pass checks)"
