# A rank killed (SIGKILL) mid-run under `srun --mpi=pmix --kill-on-bad-exit=1` (slurm/common.sh) on
# the local cluster, 2 nodes x 2 tasks, tiny preset: the job ends FAILED within seconds with no rank
# left behind and no core file; srun ends the other ranks with SIGTERM, on which each of them writes
# its flight record (log.dir/flight/rank-N.json); `tessera diagnose` names the killed rank as the
# one without a record in the collective the others were in.
source "$(dirname "$0")/lib.bash"

cat >job.sbatch <<JOB
#!/bin/bash
source "\$TESSERA_SRC/slurm/common.sh" || exit 2
tessera_launch "\$TESSERA_BIN" train --set model.preset=tiny --set data.seq_len=32 --set train.micro_batch=1 \
  --set train.steps=100000 --set log.every=1000 --set log.dir=$WORK/log --set comm.timeout_s=60
JOB
job=$(sbatch --parsable --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --time=00:05:00 --output=job.out job.sbatch)
wait_state "$job" RUNNING 60
for ((i = 0; i < 1200; i++)); do  # until training reports step >= 3
  [[ -f $WORK/log/metrics.jsonl && $(wc -l <"$WORK/log/metrics.jsonl") -ge 3 ]] && break
  sleep 0.1
done
[[ $(job_field "$job" JobState) == RUNNING ]] || fail "job $job is not running (state $(job_field "$job" JobState))"

# The ranks of this job: tessera processes whose environment carries its job id.
ranks_of_job() {  # prints "pid procid" per rank
  local p env
  for p in $(pgrep -x tessera); do
    env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    grep -qx "SLURM_JOB_ID=$job" <<<"$env" || continue
    echo "$p $(sed -n 's/^SLURM_PROCID=//p' <<<"$env")"
  done
}
victim=$(ranks_of_job | awk '$2 == 2 {print $1}')
[[ -n $victim ]] || fail "no rank 2 of job $job found: $(ranks_of_job)"
kill -9 "$victim"
t0=$(date +%s.%N)
wait_state "$job" "FAILED|COMPLETED|CANCELLED|TIMEOUT|NODE_FAIL" 60
took=$(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
[[ $(job_field "$job" JobState) == FAILED ]] || fail "job ended $(job_field "$job" JobState), not FAILED"
[[ -z $(ranks_of_job) ]] || fail "ranks of job $job still alive: $(ranks_of_job)"
# srun's report may reach job.out a moment after slurmctld records the job's end (seen under load).
for ((i = 0; i < 100; i++)); do grep -q "task 2: Killed" job.out && break; sleep 0.1; done
grep -q "task 2: Killed" job.out || fail "srun did not report the killed task: $(tail -c 600 job.out)"
echo "ok: job $job FAILED ${took}s after rank 2 was killed; no rank left"

for r in 0 1 3; do [[ -s $WORK/log/flight/rank-$r.json ]] || fail "no flight record of rank $r: $(ls "$WORK/log/flight" 2>&1)"; done
[[ ! -e $WORK/log/flight/rank-2.json ]] || fail "the killed rank has a flight record"
[[ $(json_get "$WORK/log/flight/rank-1.json" 'd["reason"]') == "signal SIGTERM" ]] || fail "rank 1's record: $(json_get "$WORK/log/flight/rank-1.json" 'd["reason"]')"
echo "ok: ranks 0, 1, 3 wrote their flight records on srun's SIGTERM"

"$TESSERA_BIN" diagnose "$WORK/log" >diag.out || fail "diagnose failed"
grep -q "^flight records of ranks 0-1, 3 of 4 (run .*); no record from rank 2$" diag.out || fail "diagnose: $(cat diag.out)"
grep -qE "^summary: collective #[0-9]+ .* on group 'world' \(mpi, ranks 0-3\) at step [0-9]+, train step did not complete: rank 2 has no flight record" diag.out ||
  fail "diagnose does not name rank 2 in the world collective: $(cat diag.out)"
# The survivors were running when srun ended them (a SIGCONT before SIGTERM is no stop).
! grep -q "was stopped" diag.out || fail "diagnose calls a surviving rank stopped: $(cat diag.out)"
[[ -z $(find "$WORK" -name 'core*' -type f) ]] || fail "core files written"
echo "ok: $(grep '^summary' diag.out)"
