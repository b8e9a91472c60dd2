// Internal to runtime/checkpoint: the byte layout of one rank file, shared by the writer (which
// writes it) and rank 0 (which describes every rank's file in the manifest without communication).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/fsdp/shard_plan.h"

namespace tessera::checkpoint {

// Host bytes a writer stages through, a block at a time, for what it cannot write from the
// shard's own memory: a kind kept in bf16 (widened to fp32) and, in a synchronous save, a shard
// on a GPU (copied down block by block). The memory model's checkpoint term of a synchronous save.
constexpr int64_t kStagingBytes = int64_t(4) << 20;

// One contiguous run of elements (fp32, or 1-byte codes) in a rank file: elements
// [param_offset, +length) of parameter `param` of unit `unit`, of the kind'th state kind saved,
// taken from the rank's shard (or, for a block kind, its per-block tensor) at shard_offset, stored
// at byte_offset.
struct Piece {
  int unit = 0, param = 0, kind = 0;
  int64_t shard_offset = 0, param_offset = 0, length = 0;
  uint64_t byte_offset = 0;
  int elem_bytes = 4;
};

// How one kind is stored: bytes per element (4: F32, 1: U8) and shard elements per value
// (NamedShards::block).
struct KindLayout {
  int elem_bytes = 4;
  int64_t block = 1;
};

// The plan a kind with blocks of `block` elements is laid out by: every parameter as its
// ceil(numel / block) values at offset / block, chunk / block values per shard. The plan's
// alignment must be a multiple of the block (Error otherwise, naming `kind`).
fsdp::ShardPlan block_plan(const fsdp::ShardPlan& plan, int64_t block, const std::string& kind);

// File order: unit by unit; within a unit kind by kind (in the order given to save: param,
// exp_avg, exp_avg_sq for the trainer); within a kind the rank's slices in flat order. Padding is
// not stored.
std::vector<Piece> file_layout(const std::vector<fsdp::ShardPlan>& plans, int rank, const std::vector<KindLayout>& kinds);
// num_kinds fp32 kinds of one value per element.
inline std::vector<Piece> file_layout(const std::vector<fsdp::ShardPlan>& plans, int rank, int num_kinds) {
  return file_layout(plans, rank, std::vector<KindLayout>(static_cast<size_t>(num_kinds)));
}
uint64_t file_bytes(const std::vector<Piece>& layout);

std::string rank_file_name(int rank);  // rank-00003.bin

}  // namespace tessera::checkpoint
