# Sourced by the shell tests that launch real MPI ranks: the one mpirun command line for this host
# (as root, oversubscribed, Open MPI over TCP on loopback, one torch thread per rank).
# (The helpers the CLI test scripts share are in tests/expect.bash.)
# Not a test itself (ctest registers only *.sh).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# TCP on the loopback subnet, not "lo" by name: Open MPI 5's TCP BTL finds no reachable pairing on
# "lo", and its launcher (PRRTE) no out-of-band interface when limited to "lo"; 4.x keeps oob on lo.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include 127.0.0.1/8
        -x OMP_NUM_THREADS=1)
if mpirun --version 2>/dev/null | grep -q 'Open MPI) [1-4]\.'; then MPIRUN+=(--mca oob_tcp_if_include lo); fi

# rank_pids PID: the tessera (or tessera-faults) processes below PID, by pid (mpirun's children; found through any
# process between, e.g. `timeout`, or Open MPI 5's launcher, which is not named mpirun).
rank_pids() {
  local p
  for p in $(pgrep -P "$1"); do
    if [[ $(cat "/proc/$p/comm" 2>/dev/null) == tessera?(-faults) ]]; then echo "$p"; else rank_pids "$p"; fi
  done
}

# work_dir NAME: WORK, a fresh /tmp/tessera-NAME-XXXXXX removed when the script exits.
work_dir() {
  WORK=$(mktemp -d "/tmp/tessera-$1-XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
}
