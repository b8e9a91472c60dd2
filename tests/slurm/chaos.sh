#!/usr/bin/env bash
# The chaos soak's short version (tests/chaos/soak.sh, whose header says how it works) in the test
# suite: four faults, one of each kind no other test makes on the cluster, in one job that SLURM
# requeues after each: checkpoint.dir full during a save, the training data truncated under the run,
# a node lost (its slurmd, slurmstepd and ranks killed: the job comes back on the other node, W 4 -> 2,
# then grows back to W 4), the newest checkpoint corrupted (skipped for the one before). It must end
# with every fault survived, the loss within tolerance of an uninterrupted run and the final state
# byte-identical to the same resharding done by hand. About 3 minutes (each requeue waits out the
# local cluster's cred_expire, 10 s). 320 steps: after the node loss the run goes on at W 2, whose
# steps take a quarter of W 4's (2 ranks on 2 cores, 25 ms), and it keeps training while the soak
# restarts the lost node's slurmd; with 80 and then 160 steps the run reached its end before the
# last fault (2026-12-04 under a loaded suite; 2026-12-06 on an idle host, where the W 2 run went
# from step 8 to 156 before the next fault).
set -euo pipefail
exec bash "${TESSERA_SRC:?}/tests/chaos/soak.sh" --faults 4 --seed 2 --kinds disk_full,data,node_loss,corrupt --steps 320
