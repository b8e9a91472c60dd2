// Internal to runtime/checkpoint: the byte layout of one rank file, shared by the writer (which
// writes it) and rank 0 (which describes every rank's file in the manifest without communication).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/fsdp/shard_plan.h"

namespace tessera::checkpoint {

// One contiguous run of fp32 elements in a rank file: elements [param_offset, +length) of
// parameter `param` of unit `unit`, of the kind'th state kind saved, taken from the rank's shard at
// shard_offset, stored at byte_offset.
struct Piece {
  int unit = 0, param = 0, kind = 0;
  int64_t shard_offset = 0, param_offset = 0, length = 0;
  uint64_t byte_offset = 0;
};

// File order: unit by unit; within a unit kind by kind (in the order given to save: param,
// exp_avg, exp_avg_sq for the trainer); within a kind the rank's slices in flat order. Padding is
// not stored.
std::vector<Piece> file_layout(const std::vector<fsdp::ShardPlan>& plans, int rank, int num_kinds);
uint64_t file_bytes(const std::vector<Piece>& layout);

std::string rank_file_name(int rank);  // rank-00003.bin

}  // namespace tessera::checkpoint
