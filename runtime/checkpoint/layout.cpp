#include "runtime/checkpoint/layout.h"

#include <cstdio>

namespace tessera::checkpoint {

std::vector<Piece> file_layout(const std::vector<fsdp::ShardPlan>& plans, int rank, int num_kinds) {
  std::vector<Piece> out;
  uint64_t cursor = 0;
  for (size_t u = 0; u < plans.size(); ++u)
    for (int k = 0; k < num_kinds; ++k)
      for (const auto& s : plans[u].slices(rank)) {
        out.push_back({static_cast<int>(u), s.param, k, s.shard_offset, s.param_offset, s.length, cursor});
        cursor += static_cast<uint64_t>(s.length) * sizeof(float);
      }
  return out;
}

uint64_t file_bytes(const std::vector<Piece>& layout) {
  return layout.empty() ? 0 : layout.back().byte_offset + static_cast<uint64_t>(layout.back().length) * sizeof(float);
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

}  // namespace tessera::checkpoint
