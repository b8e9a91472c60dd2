#!/usr/bin/env bash
# Chaos soak on the local Slurm cluster (slurm/local-cluster, 2 emulated nodes x 2 ranks): one
# training job of the tiny preset, checkpointing every few steps (sync and async saves in turn), gets
# N faults at random steps drawn from a printed seed, each of which ends the run; SLURM requeues it
# (slurm/train.sbatch with TESSERA_REQUEUE_ON_FAILURE) and it resumes with no human step. Prints a
# table (fault, step, how it ended, seconds until training resumed, steps lost) and whether the final
# masters, moments and data position are byte-identical to an uninterrupted run (or, when a lost node
# changed the world size, to the same resharding done by hand, with the loss within tolerance of the
# uninterrupted run). Exit 0 only when every fault was survived and every check holds.
#
#   tests/chaos/soak.sh --faults N --seed S [--kinds kill9,sigstop,...] [--every K] [--keep]
#
# Fault kinds (tests/chaos/soak.py says how each is made): kill9, sigstop, preempt, node_loss,
# disk_full, corrupt, data. Needs root (the cluster's daemons, and a tmpfs for checkpoint.dir that
# the disk_full fault fills). Environment: TESSERA_BIN (the build's bin folder; default build/bin),
# TESSERA_SRC (the repository; default this checkout). The cluster lives in /tmp/tessera-slurm-ctest
# on ports 17817+ (as the slurm tests'), is restarted with SlurmdTimeout=TESSERA_SLURMD_TIMEOUT
# (default 8 s: how long a lost node takes to be declared DOWN) and is brought down on exit.
# tests/slurm/chaos.sh runs a short version in the test suite.
set -euo pipefail
SRC=${TESSERA_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN_DIR=${TESSERA_BIN:-$SRC/build/bin}
[[ -d $BIN_DIR ]] || BIN_DIR=$(dirname "$BIN_DIR")
export TESSERA_SRC=$SRC TESSERA_BIN=$BIN_DIR/tessera
export TESSERA_SLURM_DIR=${TESSERA_SLURM_TEST_DIR:-/tmp/tessera-slurm-ctest}
export TESSERA_SLURM_PORT=${TESSERA_SLURM_TEST_PORT:-17817}
export TESSERA_SLURMD_TIMEOUT=${TESSERA_SLURMD_TIMEOUT:-8}

fail() { echo "soak: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || fail "needs root (the local cluster's daemons, a tmpfs for checkpoint.dir)"
[[ -x $TESSERA_BIN ]] || fail "no tessera binary at $TESSERA_BIN (build it, or set TESSERA_BIN)"
keep=0
for a in "$@"; do [[ $a == --keep ]] && keep=1; done

WORK=$(mktemp -d /tmp/tessera-chaos.XXXXXX)
cleanup() {
  local rc=$?
  "$SRC/slurm/local-cluster" down >/dev/null 2>&1 || true
  umount -l "$WORK/ckfs" 2>/dev/null || true
  if ((rc != 0 || keep)); then echo "soak: work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# checkpoint.dir on a file system of its own, small enough to fill: 64 MiB (a tiny checkpoint is ~1 MiB).
mkdir -p "$WORK/ckfs"
mount -t tmpfs -o size=64m tmpfs "$WORK/ckfs" || fail "cannot mount a tmpfs on $WORK/ckfs"
# A cluster of our own settings (an earlier one on these ports may have another SlurmdTimeout).
"$SRC/slurm/local-cluster" down >/dev/null 2>&1 || true
"$SRC/slurm/local-cluster" up >/dev/null
eval "$("$SRC/slurm/local-cluster" env)"
cd "$WORK"
python3 "$SRC/tests/chaos/soak.py" --work "$WORK" "$@"
