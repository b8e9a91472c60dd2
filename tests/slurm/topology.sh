# `tessera topo --json` in a 2-node x 2-task sbatch job on the local Slurm cluster, launched both
# ways (srun --mpi=pmix and mpirun inside the allocation): the 2x2 layout must come out of SLURM/MPI.
source "$(dirname "$0")/lib.bash"

cat >topo.sbatch <<'JOB'
#!/bin/bash
source "$TESSERA_SRC/slurm/common.sh" || exit 2
tessera_launch "$TESSERA_BIN" topo --json >"topo-$LAUNCHER.json"
JOB

for launcher in srun mpirun; do
  LAUNCHER=$launcher timeout 120 sbatch --wait --nodes=2 --ntasks-per-node=2 --output="topo-$launcher.out" \
    topo.sbatch >/dev/null || fail "topo job ($launcher) failed"
  j=topo-$launcher.json
  [[ $(json_get "$j" 'd["world_size"], d["num_nodes"], d["ranks_per_node"]') == "4 2 2" ]] ||
    fail "$launcher: want 4 ranks, 2 nodes, 2 per node; got $(json_get "$j" 'd["world_size"], d["num_nodes"], d["ranks_per_node"]')"
  [[ $(json_get "$j" '[n["ranks"] for n in d["nodes"]]') == "[[0, 1], [2, 3]]" ]] ||
    fail "$launcher: ranks per node $(json_get "$j" '[n["ranks"] for n in d["nodes"]]')"
  [[ $(json_get "$j" 'd["slurm"]["nodes"], d["slurm"]["nnodes"]') == "['node1', 'node2'] 2" ]] ||
    fail "$launcher: slurm view $(json_get "$j" 'd["slurm"]')"
  [[ $(json_get "$j" '[ (r["rank"], r["node"], r["local_rank"]) for r in d["ranks"]]') == \
     "[(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]" ]] ||
    fail "$launcher: rank table $(json_get "$j" 'd["ranks"]')"
  source=$(json_get "$j" 'd["layout_source"]')
  case $launcher in
    srun) [[ $source == slurm* ]] || fail "srun: layout_source '$source' is not from SLURM" ;;
    mpirun) [[ $source == *mpirun* ]] || fail "mpirun: layout_source '$source' does not say mpirun" ;;
  esac
  echo "ok: $launcher 2x2 ($source)"
done
