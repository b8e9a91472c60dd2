// Process bootstrap: MPI_Init_thread, who am I (rank, node, local rank) from MPI, the launcher's
// environment (srun / mpirun) and --ranks-per-node, consistency checks against SLURM, process
// groups (world / intra-node / inter-node), device and thread placement.
#pragma once
#include <functional>
#include <string>

#include "launcher/slurm_env.h"
#include "runtime/comm/communicator.h"

namespace tessera::launcher {

struct BootstrapOptions {
  int ranks_per_node = 0;  // >0: emulate nodes of this many consecutive ranks (overrides detection)
  int threads = 0;         // >0: torch intra-op threads per rank; 0: cores on node / local ranks
  bool init_mpi = true;    // false: single process, no MPI (self communicators)
};

struct Bootstrap {
  int world_rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;  // within the node
  int node_id = 0, num_nodes = 1;
  std::string host;
  std::string layout_source;  // which source decided the node layout
  int threads = 1;            // torch intra-op threads of this rank
  int gpu = -1;               // CUDA device of this local rank (= local rank) if visible, else -1
  std::string gpu_source;     // how the device was chosen
  SlurmEnv slurm;
  comm::ProcessGroups groups;
};

// Initialises MPI (MPI_THREAD_MULTIPLE) unless opts.init_mpi is false. Throws tessera::Error(Input)
// when SLURM and MPI disagree about rank or size, or --ranks-per-node does not divide the world.
Bootstrap bootstrap(int argc, char** argv, const BootstrapOptions& opts);

// The bootstrap of this process (after bootstrap() ran).
const Bootstrap& current();

// MPI_Finalize if MPI was initialised (idempotent).
void finalize();

// Ends every rank with `code` without waiting for collectives (MPI_Abort when MPI is up).
[[noreturn]] void abort_all(int code);

}  // namespace tessera::launcher

namespace tessera::launcher {
// Runs `fn` on every rank, then agrees across the world: if it threw on any rank, every rank throws
// CollectiveError with the lowest failing rank's message and exit code. Use around setup phases
// (config, file validation) so that bad input stops all ranks together, with nothing written.
void collectively(const std::function<void()>& fn);
}  // namespace tessera::launcher
