#!/usr/bin/env bash
# The gtest binaries (unit_tests, unit_tests_launcher, mpi_tests) each hold many test files, and
# ctest runs each file's tests as one test, with a --gtest_filter of that file's suites
# (tests/CMakeLists.txt). Checked here from what ctest would run (`ctest -N -V`) and what the binaries
# hold (--gtest_list_tests): every test of every binary is run by exactly one file's ctest test (a
# test the filters miss would never run; one two filters match would run twice), and every ctest
# test runs at least one test. Only listing: nothing is run.
set -euo pipefail
BIN=${TESSERA_BIN:?} SRC=${TESSERA_SRC:?}
BUILD=$(cd "$BIN/.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
source "$SRC/tests/expect.bash"  # ok, fail, check
export OMP_NUM_THREADS=1

# gtest's listing ("Suite." lines, then "  Test" lines) as full names, one a line.
list() { "$@" --gtest_list_tests 2>/dev/null | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }'; }

# (binary, filter) of every gtest ctest test; an MPI test's three world sizes share one.
ctest --test-dir "$BUILD" -N -V | sed -n 's/^[0-9]*: Test command: //p' |
  grep -oE "$BUILD/bin/(unit_tests|unit_tests_launcher|mpi_tests)\"? \"--gtest_filter=[^\"]*" |
  tr -d '"' | sort -u > "$T/runs"
check "ctest runs the three gtest binaries with filters ($(wc -l < "$T/runs") files)" \
  test "$(cut -d' ' -f1 "$T/runs" | sort -u | wc -l)" -eq 3 -a "$(wc -l < "$T/runs")" -ge 30
for b in unit_tests unit_tests_launcher mpi_tests; do list "$BIN/$b" | sed "s|^|$b |"; done > "$T/all"
# gtest's filter: patterns separated by ':', '*' and '?' wildcards (fnmatch, without [...] in them).
python3 - "$T/runs" "$T/all" > "$T/report" <<'PY' || true
import fnmatch, os, sys
tests = [l.split() for l in open(sys.argv[2])]
count = {tuple(t): 0 for t in tests}
bad = 0
for line in open(sys.argv[1]):
    path, flt = line.split()
    patterns = flt[len("--gtest_filter="):].split(":")
    ran = [t for t in tests if t[0] == os.path.basename(path) and any(fnmatch.fnmatchcase(t[1], p) for p in patterns)]
    if not ran:
        print("runs no test:", os.path.basename(path), flt); bad = 1
    for t in ran:
        count[tuple(t)] += 1
for t, n in count.items():
    if n != 1:
        print("run by %d ctest tests: %s %s" % (n, t[0], t[1])); bad = 1
print("tests", len(tests))
sys.exit(bad)
PY
grep -v '^tests ' "$T/report" || true
n=$(sed -n 's/^tests //p' "$T/report")
check "each of the ${n:-0} tests runs in exactly one ctest test, and each ctest test runs one or more" \
  test "$(grep -vc '^tests ' "$T/report")" -eq 0 -a "${n:-0}" -ge 300
echo "$pass passed, 0 failed"
