#include "runtime/fsdp/shard_plan.h"

#include <algorithm>

#include "util/error.h"

namespace tessera::fsdp {

ShardPlan ShardPlan::make(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params, int world,
                          int64_t align) {
  TESSERA_CHECK(world >= 1, "world size must be >= 1");
  TESSERA_CHECK(align >= 1, "alignment must be >= 1");
  ShardPlan p;
  p.world = world;
  p.align = align;
  int64_t cursor = 0;
  for (const auto& [name, shape] : params) {
    ParamSlot s;
    s.name = name;
    s.shape = shape;
    s.numel = 1;
    for (int64_t d : shape) {
      TESSERA_CHECK(d >= 0, "negative dimension in " + name);
      s.numel *= d;
    }
    s.offset = (cursor + align - 1) / align * align;
    cursor = s.offset + s.numel;
    p.params.push_back(std::move(s));
  }
  p.total = cursor;
  const int64_t quantum = static_cast<int64_t>(world) * align;
  p.padded_total = std::max<int64_t>(quantum, (p.total + quantum - 1) / quantum * quantum);
  p.chunk = p.padded_total / world;
  return p;
}

ShardPlan ShardPlan::with_world(int world) const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> ps;
  for (const auto& s : params) ps.emplace_back(s.name, s.shape);
  return make(ps, world, align);
}

std::vector<ShardSlice> ShardPlan::slices_in(int64_t begin, int64_t end) const {
  std::vector<ShardSlice> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& s = params[i];
    int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo >= hi) continue;
    out.push_back({static_cast<int>(i), lo - s.offset, lo - begin, hi - lo});
  }
  return out;
}

std::vector<ShardSlice> ShardPlan::slices(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world, "rank out of range");
  return slices_in(rank * chunk, (rank + 1) * chunk);
}

int64_t ShardPlan::padding(int rank) const {
  int64_t used = 0;
  for (const auto& s : slices(rank)) used += s.length;
  return chunk - used;
}

}  // namespace tessera::fsdp
