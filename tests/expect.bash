# Sourced by shell tests (not a test itself: ctest registers only tests/<label>/*.sh): the helpers
# every CLI test script shares. Scratch files go to $WORK (or $T), the script's scratch directory.
#   ok MSG                      count a passed check ($pass) and print it
#   fail MSG                    print FAIL, run the script's on_fail function if it defines one
#                               (logs worth showing, processes to stop), print the count, end the
#                               test (exit 1)
#   check MSG CMD...            ok MSG when CMD succeeds, else fail MSG
#   expect_error CODE WANT CMD...
#       CMD exits with CODE within 300 s, and its stderr holds exactly one error line
#       ("<program>: error: ...") matching WANT (grep basic regex); any other stderr line must be a
#       "<program>: warning: ..." line, except under mpirun (Open MPI adds notices of its own).
#   judge_error CODE WANT RC ERRFILE CMD...
#       the same verdict on a command already run (its exit code and stderr file)
# Safe under set -e / pipefail.
pass=0
ok() { pass=$((pass+1)); echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  if declare -F on_fail >/dev/null; then on_fail || true; fi
  echo "$pass passed, 1 failed"
  exit 1
}
check() { local msg=$1; shift; if "$@"; then ok "$msg"; else fail "$msg"; fi; }
expect_error() {
  local code=$1 want=$2; shift 2
  local dir=${WORK:-${T:?expect.bash: set WORK or T to a scratch directory}} rc=0
  timeout 300 "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  judge_error "$code" "$want" "$rc" "$dir/err" "$@"
}
# judge_error CODE WANT RC ERRFILE CMD...: expect_error's verdict on a command already run.
judge_error() {
  local code=$1 want=$2 rc=$3 err=$4 errors others; shift 4
  errors=$(grep -c '^[A-Za-z_]*: error' "$err" || true)
  others=$({ grep -v '^[A-Za-z_]*: \(error\|warning\)' "$err" || true; } | { grep -c . || true; })
  [ "$(basename "$1")" = mpirun ] && others=0
  if [ "$rc" = "$code" ] && [ "$errors" = 1 ] && [ "$others" = 0 ] &&
     grep '^[A-Za-z_]*: error' "$err" | grep -q -- "$want"; then
    ok "exit $code: $want"
  else
    fail "exit $rc (want $code), $errors error line(s) and $others other line(s) (want 1 and 0), want '$want', from: $* ; stderr: $(head -c 4000 "$err")"
  fi
}
# resumed_close TOL REF GOT: the last 3 losses of metrics file GOT (a run resumed from step 3) equal
# REF's steps 4..6 within relative TOL.
resumed_close() {
  python3 - "$@" <<'PY'
import json, sys
tol = float(sys.argv[1])
ref = [json.loads(l)["loss"] for l in open(sys.argv[2])][3:6]
got = [json.loads(l)["loss"] for l in open(sys.argv[3])][-3:]
assert len(got) == 3 and all(abs(a - b) <= tol * abs(a) for a, b in zip(ref, got)), (ref, got)
PY
}
