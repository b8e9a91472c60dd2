// The vocabulary components use to hand their sharded state to checkpoints: one named kind
// ("param" from the FSDP engine, "exp_avg"/"exp_avg_sq" from AdamW, ...), one flat tensor per FSDP
// unit laid out like that unit's shard on this rank (ShardPlan chunk). Checkpoints ask each
// component for its kinds instead of knowing what an engine or an optimizer keeps.
//
// A kind with block B > 1 holds one value per B elements of the shard (chunk / B values: value j
// stands for shard elements [j*B, (j+1)*B)), as the 8-bit optimizer's per-block absmax does; the
// checkpoint then stores, per parameter, ceil(numel / B) values. It needs the unit's parameters and
// shards to start at multiples of B (fsdp::Options::align a multiple of B).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tessera {

struct NamedShards {
  std::string kind;
  std::vector<at::Tensor> per_unit;
  int64_t block = 1;  // shard elements per value
};

}  // namespace tessera
