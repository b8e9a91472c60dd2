# MPI_Init must hold every rank until all ranks on all nodes are in it. Under srun --mpi=pmix the
# last PMIx fence inside MPI_Init is that barrier; if it completes per node, a rank leaves MPI_Init
# early and its first message can reach a rank on the other node that has not yet registered its
# receive handlers, which kills that rank (it happened here, about one job in ten, before
# slurm/local-cluster switched PMIx to ring fences: see write_conf there).
# init_barrier_shim.c stalls node2's ranks (SLURM_NODEID=1) for 3 s between the first and the last
# fence; every rank's MPI_Init must return after the last stall ended.
source "$(dirname "$0")/lib.bash"

SHIM=${TESSERA_TESTLIB:?set TESSERA_TESTLIB to the build testlib folder}/init_barrier_shim.so
[[ -f $SHIM ]] || fail "no init_barrier_shim in $TESSERA_TESTLIB (build the tests first)"
mkdir marks
cat >job.sbatch <<'JOB'
#!/bin/bash
source "$TESSERA_SRC/slurm/common.sh" || exit 2
tessera_launch env LD_PRELOAD="$SHIM" INIT_BARRIER_DIR="$PWD/marks" INIT_BARRIER_DELAY=3 \
  "$TESSERA_BIN" topo >/dev/null
JOB
SHIM=$SHIM timeout 120 sbatch --wait --nodes=2 --ntasks-per-node=2 --output=job.out job.sbatch >/dev/null ||
  fail "job failed: $(tail -n 20 job.out)"
python3 - marks <<'PY' || fail "MPI_Init is not a barrier across nodes"
import os, sys
d = sys.argv[1]
def notes(kind):  # rank -> time, for the ranks that wrote kind.<rank>
    paths = {r: os.path.join(d, "%s.%d" % (kind, r)) for r in range(4)}
    return {r: float(open(p).read()) for r, p in paths.items() if os.path.exists(p)}
stalled, done = notes("stalled"), notes("init_done")
assert sorted(stalled) == [2, 3], ("the shim must stall node2's ranks 2 and 3 only", sorted(os.listdir(d)))
assert sorted(done) == [0, 1, 2, 3], ("not every rank noted MPI_Init's return", sorted(os.listdir(d)))
last_stall = max(stalled.values())
for r, when in sorted(done.items()):
    print("rank %d left MPI_Init %+.3f s after node2's stall ended" % (r, when - last_stall))
early = [r for r, when in done.items() if when < last_stall]
if early:
    print("FAIL: rank(s) %s left MPI_Init while node2 was still stalled inside it" % early, file=sys.stderr)
    sys.exit(1)
PY
echo PASS
