#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12 machine, builds, and runs the suite
# (labels unit, mpi, slurm, sanitize). Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the shell tests run; the gtest binaries, the CUDA compile checks and the fuzz harnesses build
# inside the run (build.test_binaries, sanitize.fuzz_build: tests/CMakeLists.txt).
TARGETS="tessera tessera-faults init_barrier_shim" bash scripts/build.sh
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
