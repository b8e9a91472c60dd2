# Shared by slurm/*.sbatch: find the repository and the tessera binary, load slurm/env.sh, and launch
# one command on every task of the allocation. Sourced from the batch shell (sbatch runs a spooled
# copy of the template, so the repository is located through TESSERA_SRC or the submit directory).

TESSERA_SRC=${TESSERA_SRC:-${SLURM_SUBMIT_DIR:-$PWD}}
if [[ ! -f $TESSERA_SRC/slurm/env.sh ]]; then
  echo "tessera: cannot find slurm/env.sh under TESSERA_SRC='$TESSERA_SRC' (set TESSERA_SRC to the repository)" >&2
  exit 2
fi
# shellcheck source=slurm/env.sh
source "$TESSERA_SRC/slurm/env.sh"

# TESSERA_BIN may name the binary or its folder (as ctest sets it); default: the repo's build.
TESSERA_BIN=${TESSERA_BIN:-$TESSERA_SRC/build/bin/tessera}
[[ -d $TESSERA_BIN ]] && TESSERA_BIN=$TESSERA_BIN/tessera
if [[ ! -x $TESSERA_BIN ]]; then
  echo "tessera: binary '$TESSERA_BIN' not found or not executable (build it, or set TESSERA_BIN)" >&2
  exit 2
fi

# LAUNCHER=srun (default: direct launch, ranks get their identity from PMIx) or mpirun (Open MPI's
# own launcher inside the allocation; it starts one orted per node through srun).
LAUNCHER=${LAUNCHER:-srun}
# Sets LAUNCH_CMD to the command line that runs ARGS on every task.
tessera_launch_cmd() {
  case $LAUNCHER in
    srun) LAUNCH_CMD=(srun --mpi=pmix --kill-on-bad-exit=1 "$@") ;;
    mpirun)
      LAUNCH_CMD=(mpirun)
      [[ $(id -u) -eq 0 ]] && LAUNCH_CMD+=(--allow-run-as-root)
      LAUNCH_CMD+=(-np "$SLURM_NTASKS" --map-by "ppr:${SLURM_NTASKS_PER_NODE:-1}:node" "$@") ;;
    *) echo "tessera: LAUNCHER='$LAUNCHER' is neither srun nor mpirun" >&2; return 2 ;;
  esac
}
tessera_launch() { tessera_launch_cmd "$@" && "${LAUNCH_CMD[@]}"; }

# Runs `tessera_launch ARGS` in the background and waits for it, passing SIGUSR1/SIGUSR2 (from
# `#SBATCH --signal=B:...` or `scancel --batch --signal=...`) and SIGTERM on to every rank. srun
# itself dies of USR1/USR2 instead of forwarding them, so for srun they go to the job's steps through
# `scancel --signal` (every process of the step gets it); mpirun forwards them to its ranks.
# Returns the launcher's exit code.
tessera_launch_forwarding_signals() {
  # The launcher starts with USR1/USR2 ignored: a signal sent to the whole batch step (scancel
  # --batch, and --signal=B: on some versions) must not kill srun, which has no handler for them.
  tessera_launch_cmd "$@" || return
  (
    trap '' USR1 USR2
    exec "${LAUNCH_CMD[@]}"
  ) &
  local pid=$! rc sig how
  for sig in USR1 USR2 TERM; do
    if [[ $LAUNCHER == srun && $sig != TERM ]]; then
      how="scancel --signal=$sig $SLURM_JOB_ID"
    else
      how="kill -s $sig $pid"
    fi
    # shellcheck disable=SC2064
    trap "echo \"tessera: batch shell got SIG$sig, forwarding to the ranks\" >&2; $how 2>/dev/null" "$sig"
  done
  while true; do
    wait "$pid"
    rc=$?
    kill -0 "$pid" 2>/dev/null || break  # wait was interrupted by a trapped signal: keep waiting
  done
  trap - USR1 USR2 TERM
  return "$rc"
}
