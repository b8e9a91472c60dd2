#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12 machine, builds, and runs the suite
# (labels unit, mpi, slurm, sanitize). Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
