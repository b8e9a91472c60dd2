#!/usr/bin/env bash
# Collective timeouts and the flight recorder, end to end under real mpirun (2 ranks, tiny preset,
# comm.timeout_s 10):
#  stall   this script SIGSTOPs rank 1 mid-run: mpirun exits non-zero within timeout + 10 s of the
#          stop; rank 0's error names the collective (op, comm, #seq, bytes, step) and its last line
#          names rank 1 as the rank without a record in it; flight/rank-0.json is written; `tessera
#          diagnose` reports the same collective; no core files.
#  save    rank 1 stops itself (test hook) just before the checkpoint save of step 4: the save's
#          agreement times out on the checkpoint communicator; step-2 stays complete (verify) and
#          step-4 is never published.
#  load    rank 1 stops itself before loading the checkpoint it resumes from: the load's agreement
#          times out; the checkpoint is untouched.
#  desync  rank 1 issues one extra collective after step 3 (test hook): the run fails, and `tessera
#          diagnose` reports the desync with both ranks' op and size at the same collective number.
#  generate  this script SIGSTOPs rank 1 of `tessera generate`: the token broadcast (or a gather)
#          times out as training's collectives do, and `tessera diagnose` names rank 1.
#  kill    this script SIGKILLs rank 1: mpirun ends rank 0 with SIGTERM, on which it writes its record;
#          `tessera diagnose` names rank 1 as the rank without a record in rank 0's collective.
# The save/load/desync/kill cases run with comm.timeout_s 5 to keep the test short.
# Test hooks: TESSERA_TEST_FAULT (tests/support/fault_env.cpp; only the test binary tessera-faults fires them).
set -uo pipefail
BIN=${TESSERA_BIN:?}/tessera-faults  # tessera with the test fault hook (tests/support/fault_env.cpp)
T=$(mktemp -d /tmp/tessera-flight-XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
LAUNCHER=
cleanup() {
  [[ -n $LAUNCHER ]] && { pkill -9 -P "$LAUNCHER" 2>/dev/null; kill -9 "$LAUNCHER" 2>/dev/null; }
  rm -rf "$T"
}
trap cleanup EXIT
TIMEOUT=10
COMMON=(--set model.preset=tiny --set data.seq_len=32 --set train.micro_batch=1 --set train.warmup_steps=1
        --set log.every=1000)
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, fail
on_fail() { for f in "$T"/*/err; do echo "--- $f"; tail -n 15 "$f"; done; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# run_bg NAME [mpirun args --] train args...: 2 ranks in $T/NAME, in the background ($LAUNCHER).
run_bg() {
  local name=$1 margs=()
  shift
  if [[ ${1:-} == -x ]]; then margs=("$1" "$2"); shift 2; fi
  mkdir -p "$T/$name"
  (cd "$T/$name" && exec "${MPIRUN[@]}" "${margs[@]}" -np 2 "$BIN" train "${COMMON[@]}" "$@" >out 2>err) &
  LAUNCHER=$!
}
# rank_pid RANK: the pid of that rank of $LAUNCHER.
rank_pid() {
  local p
  for p in $(pgrep -P "$LAUNCHER"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
# wait_until SECONDS CMD...: polls CMD every 0.1 s.
wait_until() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit * 10; i++)); do "$@" && return 0; sleep 0.1; done
  return 1
}
running() { kill -0 "$LAUNCHER" 2>/dev/null; }
# finish SECONDS: waits for $LAUNCHER (killing it after SECONDS); sets RC.
finish() {
  wait_until "$1" eval '! running' || { kill -9 "$LAUNCHER"; fail "mpirun still running after $1 s"; }
  wait "$LAUNCHER"
  RC=$?
  LAUNCHER=
}
# timed_out NAME: waits for $LAUNCHER, stalled at $T0; it must exit 3 (a timeout) within $TIMEOUT + 10 s
# of the stall; sets RC and took.
timed_out() {
  finish 60
  took=$(since "$T0")
  [[ $RC -eq 3 ]] || fail "$1: mpirun exited $RC, not 3 (a timeout's exit code)"
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) + 10 else 1)" "$took" "$TIMEOUT" ||
    fail "$1: took ${took}s after the stop (timeout ${TIMEOUT}s + 10 s)"
}
stopped() { [[ $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) == T ]]; }
# The flight recorder's line (printed once, by the lowest rank with a record, as its last line).
# grep -a: Open MPI 5's launcher can leave non-text bytes in the captured stderr, and grep then
# prints "binary file matches" instead of the lines.
# flight_line FILE: the flight recorder's line; waits up to 3 s for it (Open MPI 5's launcher can exit
# before the forwarded output of the aborting rank has reached the file).
flight_line() {
  wait_until 3 grep -qa '^tessera: flight recorder: ' "$1" || true
  grep -a '^tessera: flight recorder: ' "$1"
}
no_cores() { [[ -z $(find "$T" -name 'core*' -type f) ]]; }

# ---- stall: rank 1 stopped from outside ------------------------------------------------------------
run_bg stall --set train.steps=100000 --set log.dir=log --set comm.timeout_s=$TIMEOUT
metrics_lines() { [[ -f $T/stall/log/metrics.jsonl && $(wc -l <"$T/stall/log/metrics.jsonl") -ge 3 ]]; }
wait_until 180 metrics_lines || fail "stall: training never reached step 3"
R1=$(rank_pid 1)
[[ -n $R1 ]] || fail "stall: no rank 1 under mpirun"
kill -STOP "$R1"
T0=$(now)
timed_out stall
ok "stall: mpirun exited $RC ${took}s after rank 1 was stopped"
err=$T/stall/err
grep -E "^tessera: error on rank 0 \(.*\): [a-z_]+(\([a-z]+\))? on comm 'world' \(rank 0 of 2, host [^)]*\), collective #[0-9]+ \([0-9]+ bytes of [a-z0-9]+, step [0-9]+, train step\), did not complete within 10s" "$err" >/dev/null ||
  fail "stall: rank 0's error does not name op, comm, collective number, bytes and step"
ok "stall: rank 0's error names op, comm, collective number, bytes and step"
seq=$(grep -aoE "^tessera: error on rank 0 .*collective #[0-9]+" "$err" | grep -oE "[0-9]+$")
line=$(flight_line "$err")
[[ $line == "tessera: flight recorder: collective #$seq "*"on group 'world' (mpi, ranks 0-1)"*"rank 1 has no flight record"*"rank 0 timed out waiting in it"* ]] ||
  fail "stall: flight recorder line does not name rank 1 at collective #$seq: $line"
# ... and it is rank 0's last line: nothing of rank 0 after it.
[[ $(grep -aE '^tessera: (error on rank 0|flight recorder)' "$err" | tail -n 1) == "$line" ]] || fail "stall: not rank 0's last line"
ok "stall: rank 0's last line names rank 1 at collective #$seq"
[[ -s $T/stall/log/flight/rank-0.json ]] || fail "stall: no flight/rank-0.json"
"$BIN" diagnose "$T/stall/log" >"$T/stall/diag" || fail "stall: diagnose failed"
# After rank 0's abort, mpirun continues rank 1 (SIGCONT, then SIGTERM) and it writes a record too,
# of where it was stopped or of how far it got after it ran again: stopped inside #$seq or the one
# before (which rank 0 completed), or behind it, or it issued #$seq only after rank 0 had timed out, or
# it completed #$seq on its side and was stopped in the next one before its last fragment left it.
# Every way the report names rank 1 as the one holding the collective up.
grep -qE "^summary: collective #($seq|$((seq - 1))) .* on group 'world' \(mpi, ranks 0-1\) at step [0-9]+, train step did not complete: rank 1 (was stopped for [0-9.]+ s while in it \(did not run: SIGSTOP or frozen\)|was in it for [0-9.]+ s without timing out \(timeout 10 s\): stopped or not running|issued it [0-9.]+ s after rank 0, later than the timeout \(10 s\): behind|completed it on its side, then was stopped for [0-9.]+ s \(did not run: SIGSTOP or frozen\)|has no flight record|last issued #[0-9]+ .*\(behind\))" "$T/stall/diag" ||
  { cat "$T/stall/diag"; fail "stall: diagnose does not name rank 1 at collective #$seq or the one before"; }
grep -q "^rank 0 (host .*): timeout: " "$T/stall/diag" || { cat "$T/stall/diag"; fail "stall: diagnose lacks rank 0's timeout"; }
ok "stall: $(grep '^summary' "$T/stall/diag")"
no_cores || fail "stall: core files written"

# ---- save: the checkpoint agreement times out ------------------------------------------------------
TIMEOUT=5
COMMON+=(--set comm.timeout_s=$TIMEOUT)
run_bg save -x TESSERA_TEST_FAULT=stall-save@1:4 --set train.steps=6 --set checkpoint.dir=ck --set checkpoint.every=2
wait_until 180 eval 'R1=$(rank_pid 1); [[ -n $R1 ]] && stopped "$R1"' || fail "save: rank 1 never stopped itself"
T0=$(now)
timed_out save
grep -qE "^tessera: error on rank 0 .* on comm 'checkpoint' .*step 4, checkpoint save\), did not complete within 5s" "$T/save/err" ||
  fail "save: no timeout of the checkpoint agreement at step 4"
line=$(flight_line "$T/save/err")
[[ $line == *"on group 'checkpoint' (mpi, ranks 0-1)"*"rank 1 has no flight record"* ]] || fail "save: last line: $line"
"$BIN" ckpt verify "$T/save/ck/step-2" >/dev/null || fail "save: step-2 does not verify"
[[ ! -e $T/save/ck/step-4 ]] || fail "save: step-4 was published"
[[ $(cat "$T/save/ck/latest") == step-2 ]] || fail "save: latest does not name step-2"
ok "save: checkpoint agreement timed out ${took}s after the stop (rc $RC); step-2 intact"
no_cores || fail "save: core files written"

# ---- load: the resume agreement times out ----------------------------------------------------------
cp -r "$T/save/ck" "$T/ck-before"
run_bg load -x TESSERA_TEST_FAULT=stall-load@1:* --set train.steps=6 --set checkpoint.dir="$T/save/ck"
finish 90
[[ $RC -eq 3 ]] || fail "load: mpirun exited $RC, not 3 (a timeout's exit code)"
grep -qE "^tessera: error on rank 0 .*checkpoint load\), did not complete within 5s" "$T/load/err" ||
  fail "load: no timeout while loading the checkpoint"
# log.dir defaults to checkpoint.dir: the failed run leaves its flight records and its run_info.json
# (written by every start) there, nothing else.
diff -r -x flight -x run_info.json "$T/ck-before" "$T/save/ck" >/dev/null ||
  fail "load: the checkpoint directory changed (beyond flight/ and run_info.json): $(diff -r -x flight -x run_info.json "$T/ck-before" "$T/save/ck" | head -5)"
ok "load: the resume timed out (rc $RC), checkpoint directory unchanged"

# ---- desync: one rank issues an extra collective ---------------------------------------------------
run_bg desync -x TESSERA_TEST_FAULT=desync@1:3 --set train.steps=8 --set log.dir=log
finish 90
[[ $RC -ne 0 ]] || fail "desync: mpirun exited 0"
"$BIN" diagnose "$T/desync/log" >"$T/desync/diag" || fail "desync: diagnose failed"
grep -qE "^summary: desync in group 'world' \(mpi, ranks 0-1\) at collective #[0-9]+: rank 0 all_reduce\(max\) 1 bytes uint8 \(1 element\) at step 3, train step; rank 1 all_reduce\(max\) 2 bytes uint8 \(2 elements\) at step 3, train step$" "$T/desync/diag" ||
  { cat "$T/desync/diag"; fail "desync: diagnose does not report both ranks' sizes"; }
ok "desync: rc $RC; $(grep '^summary' "$T/desync/diag")"
no_cores || fail "desync: core files written"

# ---- generate: rank 1 stopped from outside while generating ---------------------------------------
# comm.timeout_s and the flight recorder cover `tessera generate` as they cover training: 200 prompts
# keep it generating, and rank 1 is stopped once rank 0 has printed the first answer.
python3 -c "print('\\n'.join(['256 72 101 108 108 111'] * 200))" > "$T/many.txt"
mkdir -p "$T/generate"
(cd "$T/generate" && exec "${MPIRUN[@]}" -np 2 "$BIN" generate --checkpoint "$T/save/ck/step-2" --prompt-ids "$T/many.txt" \
  --max-new-tokens 400 --json --set comm.timeout_s=$TIMEOUT --set log.dir=log >out 2>err) &
LAUNCHER=$!
wait_until 120 test -s "$T/generate/out" || fail "generate: no answer printed"
R1=$(rank_pid 1)
[[ -n $R1 ]] || fail "generate: no rank 1 under mpirun"
kill -STOP "$R1"
T0=$(now)
timed_out generate
grep -qaE "^tessera: error on rank 0 .* on comm 'world' .*, generate\), did not complete within 5s" "$T/generate/err" ||
  fail "generate: rank 0's error does not name the generation's collective"
"$BIN" diagnose "$T/generate/log" >"$T/generate/diag" || fail "generate: diagnose failed"
grep -qE "^summary: collective #[0-9]+ .* on group 'world' \(mpi, ranks 0-1\) at generate did not complete: rank 1 " "$T/generate/diag" ||
  { cat "$T/generate/diag"; fail "generate: diagnose does not name rank 1"; }
ok "generate: mpirun exited $RC ${took}s after rank 1 was stopped; $(grep '^summary' "$T/generate/diag")"
no_cores || fail "generate: core files written"

# ---- kill: rank 1 SIGKILLed ------------------------------------------------------------------------
run_bg kill --set train.steps=100000 --set log.dir=log
metrics_lines() { [[ -f $T/kill/log/metrics.jsonl && $(wc -l <"$T/kill/log/metrics.jsonl") -ge 3 ]]; }
wait_until 180 metrics_lines || fail "kill: training never reached step 3"
R1=$(rank_pid 1)
kill -9 "$R1"
T0=$(now)
finish 60
took=$(since "$T0")
[[ $RC -ne 0 ]] || fail "kill: mpirun exited 0"
[[ -s $T/kill/log/flight/rank-0.json && ! -e $T/kill/log/flight/rank-1.json ]] || fail "kill: flight records: $(ls "$T/kill/log/flight")"
"$BIN" diagnose "$T/kill/log" >"$T/kill/diag" || fail "kill: diagnose failed"
grep -qE "^summary: collective #[0-9]+ .* on group 'world' \(mpi, ranks 0-1\) at step [0-9]+, train step did not complete: rank 1 has no flight record" "$T/kill/diag" ||
  { cat "$T/kill/diag"; fail "kill: diagnose does not name rank 1"; }
# mpirun sends rank 0 SIGCONT before SIGTERM: that alone is not a stop.
! grep -q "rank 0 was stopped" "$T/kill/diag" || { cat "$T/kill/diag"; fail "kill: rank 0 reported as stopped"; }
ok "kill: mpirun exited $RC ${took}s after the kill; $(grep '^summary' "$T/kill/diag")"
no_cores || fail "kill: core files written"
echo "$pass passed, 0 failed"
