#!/usr/bin/env bash
# Ctrl-C under mpirun saves (issue 58). Open MPI's mpirun answers SIGINT with SIGCONT to its ranks,
# SIGTERM odls_base_sigkill_timeout seconds later, and SIGKILL as long again after that (default 1 s:
# no step and save fits). With the window set as docs/TROUBLESHOOTING.md says, SIGINT to mpirun at a
# random moment of a run (as a terminal's Ctrl-C: the ranks are in process groups of their own) must
# leave a complete checkpoint that resumes bit-exactly (the next steps' losses equal those of a run
# that never stopped), and diagnose must call the run interrupted, not a failed collective.
set -euo pipefail
BIN=${TESSERA_BIN:?}/tessera
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
source "$(dirname "${BASH_SOURCE[0]}")/../expect.bash"  # ok, check, fail
WINDOW=5  # a step here takes well under a second; a save, less

$BIN init-model --preset tiny --seed 7 --out "$T/model" >/dev/null
RUN=(--set model.path="$T/model" --set data.seq_len=64 --set train.micro_batch=4 --set train.grad_accum=4
     --set train.warmup_steps=1 --set train.schedule=constant --set log.every=1 --set checkpoint.every=1000)

# The interrupted run: SIGINT to mpirun (a process group of its own, as a shell job) at a random
# moment after the first step.
setsid "${MPIRUN[@]}" --mca odls_base_sigkill_timeout $WINDOW -np 2 $BIN train "${RUN[@]}" --set train.steps=100000 \
  --set checkpoint.dir="$T/ck" --set log.dir="$T/log" >"$T/out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q '^step 2/' "$T/out" 2>/dev/null && break; sleep 0.1; done
sleep "$(python3 -c 'import random; print(round(random.uniform(0, 1.5), 2))')"
kill -INT "$pid"
wait "$pid" || true
step=$(sed -n 's/^preempted at step \([0-9]*\): checkpoint .*/\1/p' "$T/out")
[ -n "$step" ] || fail "no checkpoint after SIGINT to mpirun: $(tail -5 "$T/out")"
check "the interrupted run saved step-$step and latest names it" test "$(cat "$T/ck/latest")" = "step-$step"
check "ckpt verify step-$step" $BIN ckpt verify "$T/ck/step-$step"
$BIN diagnose "$T/log" >"$T/dx" 2>&1 || fail "diagnose exited $?: $(cat "$T/dx")"
# SIGTERM during step S: abandoned at a micro-batch boundary (step S-1 saved), or finished (step S).
head="^summary: every rank got SIGTERM at step"
if grep -q "$head $((step + 1)) (" "$T/dx"; then
  check "diagnose: interrupted during step $((step + 1)), which was abandoned; step-$step is saved" grep -q \
    "$head $((step + 1)) (Ctrl-C under mpirun, preemption or scancel), not a hang; the ranks stopped during that step and the last complete step is saved ($T/ck/step-$step," "$T/dx"
else
  grep -q "$head $step (" "$T/dx" || { echo "saved step-$step; diagnose said:"; cat "$T/dx"; }
  check "diagnose: interrupted, not a failed collective" \
    grep -q "$head $step (Ctrl-C under mpirun, preemption or scancel), not a hang" "$T/dx"
fi

# A rank whose output pipe closed (srun ending a step, a `| head`) must not die of SIGPIPE: it
# keeps training and saves on SIGTERM (slurm.flight_kill lost rank 0's flight record that way).
mkfifo "$T/pipe"
head -n 1 <"$T/pipe" >/dev/null &
"$BIN" train "${RUN[@]}" --set train.steps=100000 --set checkpoint.dir="$T/ckp" --set log.dir="$T/logp" \
  >"$T/pipe" 2>"$T/errp" &
tp=$!
for _ in $(seq 1 600); do
  [ -f "$T/logp/metrics.jsonl" ] && [ "$(wc -l <"$T/logp/metrics.jsonl")" -ge 3 ] && break
  kill -0 $tp 2>/dev/null || break
  sleep 0.1
done
kill -TERM $tp 2>/dev/null || fail "the run whose stdout closed is gone before SIGTERM: $(tail -3 "$T/errp")"
rc=0; wait $tp || rc=$?
check "a run whose stdout closed (head exited) saved on SIGTERM and exited 0 (rc $rc; $(tail -1 "$T/errp"))" \
  test $rc -eq 0 -a -s "$T/ckp/latest"

# Resume to step+2 against a run that never stopped: the same losses, to the last digit.
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if json.loads(l).get('step', 0) > int(sys.argv[2])))" "$1" "$2"; }
"${MPIRUN[@]}" -np 2 $BIN train "${RUN[@]}" --set train.steps=$((step + 2)) --set checkpoint.dir="$T/ck" \
  --set log.dir="$T/log" >"$T/out2" 2>&1 || fail "resume exited $?: $(tail -5 "$T/out2")"
"${MPIRUN[@]}" -np 2 $BIN train "${RUN[@]}" --set train.steps=$((step + 2)) --set log.dir="$T/ref" >"$T/out3" 2>&1 ||
  fail "the reference run exited $?: $(tail -5 "$T/out3")"
a=$(losses "$T/log/metrics.jsonl" "$step"); b=$(losses "$T/ref/metrics.jsonl" "$step")
check "resumed losses of steps $((step + 1))-$((step + 2)) equal the uninterrupted run's ($a / $b)" test -n "$a" -a "$a" = "$b"
echo "$pass passed, 0 failed"
