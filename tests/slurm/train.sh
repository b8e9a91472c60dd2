# Training through slurm/train.sbatch on the local cluster, 2 nodes x 2 ranks, tiny preset, hybrid
# sharding (full shard inside a node, replicated across the two nodes):
#  1. an uninterrupted run (sbatch --wait) writes its final checkpoint; the log shows the 2x2 topology;
#  2. the same run is preempted mid-way with `scancel --signal=USR2` (Tessera's default
#     train.preempt_signal): it checkpoints, requeues itself (scontrol requeue), and the second run
#     (SLURM_RESTART_COUNT=1) resumes from that step; its final parameters equal run 1's bit for bit.
source "$(dirname "$0")/lib.bash"

STEPS=${TESSERA_SLURM_TEST_STEPS:-24}
config() {  # config CKPT_DIR
  cat <<JSON
{"model": {"preset": "tiny"},
 "data": {"seq_len": 32},
 "train": {"steps": $STEPS, "micro_batch": 2, "warmup_steps": 2},
 "fsdp": {"strategy": "hybrid_shard"},
 "checkpoint": {"dir": "$1", "keep": 5}}
JSON
}
config "$WORK/ref" >ref.json
config "$WORK/pre" >pre.json
submit() {  # submit NAME CONFIG [sbatch args...]
  local name=$1 cfg=$2
  shift 2
  sbatch --parsable --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --time=00:10:00 --requeue \
    --open-mode=append --output="$WORK/$name.out" "$@" "$SRC/slurm/train.sbatch" "$WORK/$cfg"
}
final_dir() { ls -d "$1"/step-"$STEPS" 2>/dev/null; }

# 1. Uninterrupted reference run.
ref=$(submit ref ref.json --wait) || fail "reference job failed"
grep -q "4 ranks on 2 node(s), 2 per node (layout from slurm" ref.out || fail "no 2x2 SLURM topology in the log"
[[ -n $(final_dir "$WORK/ref") ]] || fail "reference run wrote no step-$STEPS checkpoint: $(ls "$WORK/ref")"
echo "ok: reference run (job $ref) wrote $(final_dir "$WORK/ref")"

# 2. Preempted run: signal the ranks once a few steps are done.
pre=$(submit pre pre.json)
wait_state "$pre" RUNNING 60
for ((i = 0; i < 600; i++)); do  # until training reports step >= 3 (metrics.jsonl, one line per step)
  [[ -f $WORK/pre/metrics.jsonl && $(wc -l <"$WORK/pre/metrics.jsonl") -ge 3 ]] && break
  sleep 0.1
done
[[ $(job_field "$pre" JobState) == RUNNING ]] || fail "job $pre finished before it could be preempted (raise STEPS)"
scancel --signal=USR2 "$pre"
# The job requeues itself: back to PENDING with Restarts=1. Skip the requeue hold-off (cred_expire).
for ((i = 0; i < 600; i++)); do
  [[ $(job_field "$pre" Restarts) -ge 1 ]] && break
  sleep 0.1
done
[[ $(job_field "$pre" Restarts) == 1 ]] || fail "job $pre was not requeued (state $(job_field "$pre" JobState))"
# slurmd refuses a batch launch whose credential dates from the second it revoked the last run's
# ("Killing non-startable batch JobId=N: Job credential revoked", a fresh-clone run, slurm.guide,
# 2026-12-04): the requeue itself holds the job off that long (cred_expire); skipping it, wait for
# the next second.
sleep 1.5
scontrol update JobId="$pre" StartTime=now 2>/dev/null || true
wait_state "$pre" "COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL" 240
[[ $(job_field "$pre" JobState) == COMPLETED ]] || fail "preempted job ended $(job_field "$pre" JobState)"

grep -q "run 2 on node\[1-2\]" pre.out || fail "no second run in the log"
stop=$(find "$WORK/pre" -maxdepth 1 -name 'step-*' -printf '%f\n' | sed 's/step-//' | sort -n | head -n 1)
((stop > 0 && stop < STEPS)) || fail "no mid-run checkpoint (checkpoints: $(ls "$WORK/pre"))"
grep -qiE "resum.*step[- ]?$stop\b|step[- ]?$stop.*resum" pre.out || fail "second run did not say it resumed from step $stop"
echo "ok: preempted at step $stop, requeued, resumed"

# Final parameters: every tensor file of the final checkpoints is identical (manifests may differ
# in timestamps, so only the data files are compared).
a=$(final_dir "$WORK/ref") b=$(final_dir "$WORK/pre")
[[ -n $b ]] || fail "preempted run wrote no step-$STEPS checkpoint"
n=0
while IFS= read -r f; do
  cmp -s "$a/$f" "$b/$f" || fail "final checkpoints differ in $f"
  n=$((n + 1))
done < <(cd "$a" && find . -type f ! -name '*.json' | sort)
((n > 0)) || fail "no tensor files in $a"
[[ $(cd "$a" && find . -type f ! -name '*.json' | sort) == $(cd "$b" && find . -type f ! -name '*.json' | sort) ]] ||
  fail "final checkpoints hold different files"
echo "ok: final parameters equal the uninterrupted run ($n files)"
