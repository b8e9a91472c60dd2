// What fsdp.strategy needs of the ranks' layout, stated once: `tessera train` checks it against the
// launched ranks and `tessera plan` against --nodes and --gpus-per-node, with the same words. (The
// engine checks only what its groups must satisfy: intra x inter = world.) Pure: no communicator.
#pragma once
#include "runtime/fsdp/names.h"

namespace tessera::fsdp {

struct Topology {
  int world = 1;
  int nodes = 1;
  int ranks_per_node = 1;  // 0: nodes run different numbers of ranks
};

// Throws Error(Input), one line naming fsdp.strategy: hybrid_shard with uneven nodes, on one node
// (full_shard with extra steps), or with one rank per node (it shards nothing).
void validate_strategy(Strategy s, const Topology& t);

}  // namespace tessera::fsdp
