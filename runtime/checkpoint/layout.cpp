#include "runtime/checkpoint/layout.h"

#include <cstdio>

#include "util/error.h"

namespace tessera::checkpoint {

fsdp::ShardPlan block_plan(const fsdp::ShardPlan& plan, int64_t block, const std::string& kind) {
  if (block == 1) return plan;
  TESSERA_CHECK(block > 1 && plan.align % block == 0,
                "checkpoint kind " + kind + " holds one value per " + std::to_string(block) +
                    " elements, but the FSDP alignment is " + std::to_string(plan.align) + " (must be a multiple of it)");
  fsdp::ShardPlan b = plan;
  b.align = plan.align / block;
  b.total = (plan.total + block - 1) / block;
  b.padded_total = plan.padded_total / block;
  b.chunk = plan.chunk / block;
  for (auto& p : b.params) {
    p.numel = (p.numel + block - 1) / block;
    p.shape = {p.numel};
    p.offset /= block;
  }
  return b;
}

std::vector<Piece> file_layout(const std::vector<fsdp::ShardPlan>& plans, int rank, const std::vector<KindLayout>& kinds) {
  std::vector<Piece> out;
  uint64_t cursor = 0;
  for (size_t u = 0; u < plans.size(); ++u)
    for (size_t k = 0; k < kinds.size(); ++k) {
      const fsdp::ShardPlan plan = block_plan(plans[u], kinds[k].block, "#" + std::to_string(k));
      for (const auto& s : plan.slices(rank)) {
        out.push_back({static_cast<int>(u), s.param, static_cast<int>(k), s.shard_offset, s.param_offset, s.length,
                       cursor, kinds[k].elem_bytes});
        cursor += static_cast<uint64_t>(s.length) * static_cast<uint64_t>(kinds[k].elem_bytes);
      }
    }
  return out;
}

uint64_t file_bytes(const std::vector<Piece>& layout) {
  return layout.empty() ? 0
                        : layout.back().byte_offset +
                              static_cast<uint64_t>(layout.back().length) * static_cast<uint64_t>(layout.back().elem_bytes);
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

}  // namespace tessera::checkpoint
