# Shared set-up for tests/slurm/*.sh (not a test itself): a private local cluster that is brought
# down on exit, whatever happens, and helpers to wait for jobs. Sourced, never run.
set -euo pipefail
SRC=${TESSERA_SRC:?set TESSERA_SRC to the repository}
BIN_DIR=${TESSERA_BIN:?set TESSERA_BIN to the build bin folder}
export TESSERA_SRC=$SRC TESSERA_BIN=$BIN_DIR/tessera
# Own state dir and ports, so a developer's cluster on the defaults is left alone.
export TESSERA_SLURM_DIR=${TESSERA_SLURM_TEST_DIR:-/tmp/tessera-slurm-ctest}
export TESSERA_SLURM_PORT=${TESSERA_SLURM_TEST_PORT:-17817}

source "$SRC/tests/expect.bash"  # ok, fail, check
WORK=$(mktemp -d /tmp/tessera-slurm-test.XXXXXX)
cleanup() {
  local rc=$?
  if ((rc != 0)); then
    # What Slurm knew about the jobs and nodes, while the daemons are still up.
    echo "--- jobs and nodes ---" >&2
    scontrol show job -o 2>&1 | awk '{ l = ""; for (i = 1; i <= NF; i++)
      if ($i ~ /^(JobId|JobName|JobState|Reason|ExitCode|Restarts|RunTime|NodeList|BatchHost)=/) l = l " " $i
      print (l == "" ? $0 : substr(l, 2)) }' >&2 || true
    sinfo -N -o '%N %T %E' >&2 2>/dev/null || true
  fi
  "$SRC/slurm/local-cluster" down >/dev/null 2>&1 || true
  if ((rc != 0)); then
    # (>&2 before 2>/dev/null: the other order would send the logs to /dev/null too.)
    echo "--- job outputs ($WORK) ---" >&2
    tail -v -n 40 "$WORK"/*.out >&2 2>/dev/null || true
    echo "--- Slurm logs ($TESSERA_SLURM_DIR/log) ---" >&2
    tail -n 20 "$TESSERA_SLURM_DIR"/log/slurmctld.log >&2 2>/dev/null || true
    tail -n 10 "$TESSERA_SLURM_DIR"/log/slurmd-*.log >&2 2>/dev/null || true
  fi
  [[ -n ${TESSERA_SLURM_TEST_KEEP:-} ]] || rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ -x $TESSERA_BIN ]] || fail "no tessera binary at $TESSERA_BIN"
"$SRC/slurm/local-cluster" up >/dev/null
eval "$("$SRC/slurm/local-cluster" env)"
cd "$WORK"

# job_field JOB FIELD: a field of `scontrol show job` (e.g. JobState, Restarts, ExitCode).
job_field() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# wait_state JOB REGEX SECONDS: until JobState matches.
wait_state() {
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    [[ $(job_field "$1" JobState) =~ ^($2)$ ]] && return 0
    sleep 0.2
  done
  fail "job $1 did not reach state '$2' within $3 s (state $(job_field "$1" JobState))"
}

# json_get FILE PYTHON-EXPR: evaluates EXPR with `d` = the JSON document in FILE.
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
