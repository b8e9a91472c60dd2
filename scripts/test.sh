#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12 machine, builds, and runs the suite
# (labels unit, mpi, slurm, sanitize). Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
# Packages: what the build needs first (scripts/deps.sh --main); the test suite's own (Slurm,
# Chromium, PyTorch, clang, Node.js, the npm references) then install while it builds. On a fresh
# machine apt and dpkg run on about one core, so the build uses the other and their install costs
# little wall time (the build links only against the --main packages; nothing there is upgraded).
bash scripts/deps.sh --main
deps_log=$(mktemp)
bash scripts/deps.sh >"$deps_log" 2>&1 &
deps_pid=$!
# What the shell tests run; the gtest binaries, the CUDA compile checks and the fuzz harnesses build
# inside the run (build.test_binaries, sanitize.fuzz_build: tests/CMakeLists.txt).
build_rc=0
DEPS=--main TARGETS="tessera tessera-faults init_barrier_shim" bash scripts/build.sh || build_rc=$?
deps_rc=0
wait "$deps_pid" || deps_rc=$?
cat "$deps_log"
rm -f "$deps_log"
((deps_rc == 0)) || { echo "test.sh: installing the test suite's packages failed (bash scripts/deps.sh: exit $deps_rc)" >&2; exit "$deps_rc"; }
((build_rc == 0)) || exit "$build_rc"
cd build
# The processors online are the cores. Every test holds PROCESSORS of them (the
# resource `cores`, RESOURCE_GROUPS in tests/CMakeLists.txt): tests that start MPI ranks or build
# take two and run alone, except those that mostly wait (on Slurm, on failing ranks) or train on
# about one core, which take one. One more job than cores: the fillers (the builds above, the
# LibTorch 2.6 syntax check) run at nice 19 beside them, on what they leave idle. COST there orders
# a fresh clone's first run.
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it obeys OMP_NUM_THREADS
printf '{"version": {"major": 1, "minor": 0}, "local": [{"cores": [{"id": "0", "slots": %d}]}]}\n' "$cores" \
  >ctest-resources.json
ctest --output-on-failure --timeout 900 -j"$((cores + 1))" --resource-spec-file ctest-resources.json "$@"
