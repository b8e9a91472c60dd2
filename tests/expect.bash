# Sourced by shell tests (not a test itself: ctest registers only tests/<label>/*.sh).
# fail MSG: print FAIL and end the test. expect_error CODE PATTERN CMD...: CMD exits with CODE and
# writes exactly one stderr line, matching PATTERN (grep). Needs $WORK, a scratch directory.
fail() { echo "FAIL: $*"; exit 1; }
expect_error() {
  local code=$1 pattern=$2; shift 2
  "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  [ "$rc" = "$code" ] || fail "exit $rc (want $code) from: $* ; stderr: $(cat "$WORK/err")"
  [ "$(grep -c . "$WORK/err")" = 1 ] || fail "stderr is not one line: $(cat "$WORK/err")"
  grep -q -- "$pattern" "$WORK/err" || fail "stderr lacks '$pattern': $(cat "$WORK/err")"
}
