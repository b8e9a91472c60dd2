// ShardPlan: pure arithmetic, no MPI, no tensors. Given a unit's parameters (name + shape), a group
// size W and an alignment A (elements), it lays the parameters out in ONE flat buffer and cuts it
// into W equal shards:
//
//   flat index space  [0, total)          params back to back, each starting at a multiple of A
//   padded_total      = ceil(total / (W*A)) * W*A      (zero padding at the end; never refused)
//   shard r           = [r*chunk, (r+1)*chunk),  chunk = padded_total / W
//
// A parameter's offset does not depend on W, only the end padding and the cut points do, so a
// checkpoint written at world size A can be read at world size B by intersecting flat ranges.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::fsdp {

struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // in the flat buffer
};

// The part of one parameter that lives in one rank's shard.
struct ShardSlice {
  int param = 0;             // index into ShardPlan::params
  int64_t param_offset = 0;  // first element of the parameter (row-major) in this slice
  int64_t shard_offset = 0;  // where it goes in the rank's shard
  int64_t length = 0;
};

struct ShardPlan {
  std::vector<ParamSlot> params;
  int world = 1;
  int64_t align = 1;
  int64_t total = 0;         // last parameter's end
  int64_t padded_total = 0;  // multiple of world*align
  int64_t chunk = 0;         // elements per shard

  static ShardPlan make(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params, int world,
                        int64_t align = 1);
  // Same parameters, another group size (used by resharding).
  ShardPlan with_world(int world) const;

  int64_t shard_begin(int rank) const { return rank * chunk; }
  // Slices of every parameter intersecting rank's shard, in flat order.
  std::vector<ShardSlice> slices(int rank) const;
  // Slices intersecting an arbitrary flat range [begin, end).
  std::vector<ShardSlice> slices_in(int64_t begin, int64_t end) const;
  // Elements of rank's shard that hold no parameter (gaps and end padding).
  int64_t padding(int rank) const;
};

}  // namespace tessera::fsdp
