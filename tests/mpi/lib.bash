# Sourced by the shell tests that launch real MPI ranks: the one mpirun command line for this host
# (as root, oversubscribed, Open MPI over TCP on loopback, one torch thread per rank).
# Also the small helpers (ok, die, check, expect_error) the CLI test scripts share.
# Not a test itself (ctest registers only *.sh).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo -x OMP_NUM_THREADS=1)

# Helpers of the CLI test scripts: they count into $pass and write scratch files into $T.
pass=0
ok() { pass=$((pass+1)); echo "ok: $*"; }
die() { echo "FAIL: $*"; echo "$pass passed, 1 failed"; exit 1; }
check() { local msg=$1; shift; if "$@"; then ok "$msg"; else die "$msg"; fi; }
# expect_error NAME SUBSTRING CMD...: exit 2 and exactly one 'tessera' line on stderr (mpirun adds
# its own banner) containing SUBSTRING.
expect_error() {
  local name=$1 want=$2; shift 2
  timeout 120 "$@" >"$T/out" 2>"$T/err"; local rc=$?
  local lines; lines=$(grep -c '^tessera' "$T/err")
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/err"; then ok "$name"; else
    echo "rc=$rc lines=$lines want '$want'"; cat "$T/err"; die "$name"; fi
}
