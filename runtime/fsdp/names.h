// The configuration names of the FSDP enums (fsdp.h's Strategy and Accumulate), in enum order: one
// list that the parsers (fsdp.cpp), the configuration schema's choices (launcher/config.cpp) and
// `bench step --peer` all read. Header-only and dependency-free (the config fuzz harness compiles
// config.cpp without the runtime).
#pragma once
#include <string>
#include <vector>

namespace tessera::fsdp {

// Index i is Strategy(i): full_shard, shard_grad_op, no_shard, hybrid_shard.
inline const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"};
  return names;
}

// Index i is Accumulate(i): sharded, unsharded.
inline const std::vector<std::string>& accumulate_names() {
  static const std::vector<std::string> names = {"sharded", "unsharded"};
  return names;
}

}  // namespace tessera::fsdp
