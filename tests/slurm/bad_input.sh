# Bad submissions fail fast with exactly one line and exit 2, and nothing is queued: a missing
# config, GPUs per node that do not match tasks per node, an unwritable checkpoint dir, bad numbers.
# The same checks run again inside the job (sbatch used directly): the job ends at once with exit 2.
source "$(dirname "$0")/lib.bash"

echo '{"model": {"preset": "tiny"}, "checkpoint": {"dir": "'"$WORK"'/ckpt"}}' >run.json
echo '{"model": ' >broken.json
touch a-file
mk() { make --no-print-directory -C "$SRC" -f Makefile.slurm LOCAL=1 LOGDIR="$WORK/logs" TESSERA_BIN="$TESSERA_BIN" "$@"; }

# expect_one_line WANT-SUBSTRING make-args...
expect_one_line() {
  local want=$1 out rc
  shift
  set +e
  out=$(mk "$@" 2>&1)
  rc=$?
  set -e
  ((rc == 2)) || fail "make $* exited $rc (want 2): $out"
  [[ $(wc -l <<<"$out") -eq 1 ]] || fail "make $* printed more than one line: $out"
  [[ $out == *"$want"* ]] || fail "make $*: '$out' does not mention '$want'"
  echo "ok: $out"
}
base=(submit NODES=2 TIME=00:05:00)
expect_one_line "config '$WORK/nope.json' does not exist" "${base[@]}" CONFIG="$WORK/nope.json" GPUS_PER_NODE=0
expect_one_line "is not valid JSON" "${base[@]}" CONFIG="$WORK/broken.json" GPUS_PER_NODE=0
expect_one_line "tasks per node (4) must equal GPUs per node (2)" "${base[@]}" CONFIG="$WORK/run.json" GPUS_PER_NODE=2 TASKS_PER_NODE=4
expect_one_line "checkpoint.dir '$WORK/a-file/ckpt' is not writable" "${base[@]}" CONFIG="$WORK/run.json" GPUS_PER_NODE=0 \
  ARGS="--set checkpoint.dir=$WORK/a-file/ckpt"
expect_one_line "checkpoint.dir '/proc/tessera-ckpt' is not writable" "${base[@]}" CONFIG="$WORK/run.json" GPUS_PER_NODE=0 \
  ARGS="--set checkpoint.dir=/proc/tessera-ckpt"
expect_one_line "GPUS_PER_NODE='two' is not a non-negative integer" "${base[@]}" CONFIG="$WORK/run.json" GPUS_PER_NODE=two
expect_one_line "GPUS_PER_NODE is not set" "${base[@]}" CONFIG="$WORK/run.json"
expect_one_line "NODES='0' is not a positive integer" submit NODES=0 CONFIG="$WORK/run.json" GPUS_PER_NODE=0
expect_one_line "SIGNAL='HUP' must be USR1 or USR2" "${base[@]}" CONFIG="$WORK/run.json" GPUS_PER_NODE=0 SIGNAL=HUP
expect_one_line "no valid job id" status JOB=
[[ -z $(squeue -h) ]] || fail "a bad submission reached the queue: $(squeue -h)"
[[ ! -e $WORK/logs/.last-job ]] || fail "a bad submission recorded a job"

# Inside the job: sbatch of the template with a config that does not exist.
jid=$(sbatch --parsable --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --output=job.out \
        "$SRC/slurm/train.sbatch" "$WORK/missing.json")
wait_state "$jid" "FAILED|COMPLETED" 60
[[ $(job_field "$jid" ExitCode) == 2:0 ]] || fail "job exit code $(job_field "$jid" ExitCode), want 2:0"
grep -qx "tessera preflight: config '$WORK/missing.json' does not exist" job.out || fail "job output: $(cat job.out)"
[[ $(grep -c preflight job.out) -eq 1 ]] || fail "more than one error line in the job"
echo "ok: the job itself stops with one line when the config is missing"
