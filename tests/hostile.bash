# Sourced by the hostile-input tests (tests/*/hostile_*.sh), after tests/expect.bash. A probe is a
# file that a download or a colleague could hand Tessera: hostile (bombs, deep nesting, planted
# links) or just broken. Whatever it holds, the command must end in one line and exit 2 (or succeed
# within its bound): util/budgets.h and docs/LIMITS.md.
#   hostile_setup       makes $OUTSIDE, a folder beside the run's with a file and a link in it, where
#                       probes point their links: nothing in it may ever change
#   probe CODE WANT MIB CMD...
#       CMD is judged as expect_error judges it (CODE 0: it succeeds and WANT is ignored), and
#       fails the test when it runs past $HOSTILE_TIMEOUT s (60: a hang), ends on a signal, its
#       largest process (ranks under mpirun included: GNU time's maximum resident set of the tree)
#       peaks over MIB MiB, or anything in $OUTSIDE changed.
HOSTILE_TIMEOUT=${HOSTILE_TIMEOUT:-60}

hostile_setup() {
  local dir=${WORK:-${T:?hostile.bash: set WORK or T to a scratch directory}}
  OUTSIDE=$dir/outside
  mkdir -p "$OUTSIDE/sub"
  echo "a file nobody asked Tessera to touch" >"$OUTSIDE/precious.txt"
  echo "another one" >"$OUTSIDE/sub/also.txt"
  ln -sfn precious.txt "$OUTSIDE/link"
  outside_state >"$dir/outside.state"
}

# Names, types, sizes, modes, link targets and contents of everything in $OUTSIDE.
outside_state() {
  (cd "$OUTSIDE" && find . -printf '%p %y %s %m %l\n' | LC_ALL=C sort &&
     find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
}

probe() {
  local code=$1 want=$2 mib=$3; shift 3
  local dir=${WORK:-$T} rc=0 kib
  /usr/bin/time -f '%M' -o "$dir/rss" timeout -k 5 "$HOSTILE_TIMEOUT" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
  kib=$(tail -n 1 "$dir/rss")
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    fail "still running after ${HOSTILE_TIMEOUT} s (a hang): $*"
  elif [ "$rc" -ge 128 ]; then
    fail "ended on signal $((rc - 128)): $* ; stderr: $(head -c 2000 "$dir/err")"
  elif [ "$kib" -gt $((mib * 1024)) ]; then
    fail "peak resident memory $((kib / 1024)) MiB, over its bound of $mib MiB: $*"
  elif [ -n "${OUTSIDE:-}" ] && ! outside_state | cmp -s - "$dir/outside.state"; then
    fail "changed something outside the paths it was given ($OUTSIDE): $*"
  fi
  if [ "$code" = 0 ]; then
    [ "$rc" = 0 ] || fail "exit $rc (want 0): $* ; stderr: $(head -c 2000 "$dir/err")"
    ok "succeeds within ${mib} MiB: $(basename "$1") ${2:-}"
  else
    judge_error "$code" "$want" "$rc" "$dir/err" "$@"
  fi
}
