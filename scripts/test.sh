#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12 machine, builds, and runs the suite
# (labels unit, mpi, slurm, sanitize). Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
# Two tests at a time on a 2-core machine (CTEST_JOBS to change): tests that start MPI ranks or
# build take both cores (PROCESSORS in tests/CMakeLists.txt) and run alone, except those that mostly
# wait (on Slurm, on failing ranks) or train on about one core, which take one. COST there orders a
# fresh clone's first run.
ctest --output-on-failure --timeout 900 -j"${CTEST_JOBS:-$(nproc)}" "$@"
