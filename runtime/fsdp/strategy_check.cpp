#include "runtime/fsdp/strategy_check.h"

#include <string>

#include "util/error.h"

namespace tessera::fsdp {

void validate_strategy(Strategy s, const Topology& t) {
  if (s != Strategy::HybridShard) return;
  const std::string world = std::to_string(t.world);
  TESSERA_CHECK_INPUT(t.ranks_per_node > 0 && t.nodes * t.ranks_per_node == t.world,
                      "fsdp.strategy hybrid_shard needs the same number of ranks on every node (world " + world + ", " +
                          std::to_string(t.nodes) + " nodes); use --ranks-per-node");
  TESSERA_CHECK_INPUT(t.nodes >= 2, "fsdp.strategy hybrid_shard on 1 node (" + world +
                                        " ranks) replicates nothing: it is full_shard with extra steps; use "
                                        "fsdp.strategy full_shard, or 2 or more nodes");
  TESSERA_CHECK_INPUT(t.ranks_per_node >= 2, "fsdp.strategy hybrid_shard with one rank per node shards nothing; use "
                                             "fsdp.strategy no_shard, or 2 or more ranks per node");
}

}  // namespace tessera::fsdp
