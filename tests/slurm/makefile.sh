# Makefile.slurm against the local cluster: submit -> status -> cancel for a job held in the queue,
# and submit -> (job runs train on 2 nodes x 2 ranks) -> status COMPLETED -> logs.
source "$(dirname "$0")/lib.bash"

cat >run.json <<JSON
{"model": {"preset": "tiny"}, "train": {"steps": 3}, "data": {"seq_len": 32},
 "checkpoint": {"dir": "$WORK/ckpt"}}
JSON
mk() { make --no-print-directory -C "$SRC" -f Makefile.slurm LOCAL=1 LOGDIR="$WORK/logs" TESSERA_BIN="$TESSERA_BIN" "$@"; }
last_job() { sed -n 's/^JOB=//p' "$WORK/logs/.last-job"; }

# 1. A job that may not start for an hour: status says PENDING, cancel ends it.
out=$(mk submit CONFIG="$WORK/run.json" NODES=2 GPUS_PER_NODE=0 TASKS_PER_NODE=2 TIME=00:05:00 \
        SBATCH_FLAGS=--begin=now+3600)
[[ $out == "submitted job "* ]] || fail "submit said: $out"
held=$(last_job)
[[ $(mk status) == "job $held tessera-train PENDING "* ]] || fail "status of held job: $(mk status)"
[[ $(job_field "$held" NumNodes) =~ ^2(-2)?$ && $(job_field "$held" NumTasks) == 4 ]] ||
  fail "held job has $(job_field "$held" NumNodes) nodes / $(job_field "$held" NumTasks) tasks, want 2 / 4"
[[ $(job_field "$held" Requeue) == 1 ]] || fail "job is not requeueable"
mk cancel | grep -qx "cancelled job $held" || fail "cancel"
wait_state "$held" CANCELLED 20
[[ $(mk status JOB="$held") == "job $held tessera-train CANCELLED "* ]] || fail "status after cancel: $(mk status JOB="$held")"
echo "ok: submit/status/cancel"

# 2. A job that runs: 2 nodes x 2 CPU ranks of the tiny preset, then status and logs.
mk submit CONFIG="$WORK/run.json" NODES=2 GPUS_PER_NODE=0 TASKS_PER_NODE=2 TIME=00:05:00 >/dev/null
job=$(last_job)
[[ $job != "$held" ]] || fail "no new job id recorded"
wait_state "$job" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY" 180
[[ $(mk status) == "job $job tessera-train COMPLETED restarts=0 nodes=node[1-2] "* ]] ||
  fail "status of finished job: $(mk status)"
logs=$(mk logs LINES=1000)
grep -q "^tessera: job $job run 1 on node\[1-2\]" <<<"$logs" || fail "logs lack the job header"
grep -q "4 ranks on 2 node(s), 2 per node (layout from slurm" <<<"$logs" || fail "logs lack the 2x2 topology"
grep -q "^tessera: train exited with 0" <<<"$logs" || fail "logs lack train's exit"
echo "ok: submit/status/logs of a training job"
