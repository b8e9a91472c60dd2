// The vocabulary components use to hand their sharded state to checkpoints: one named kind
// ("param" from the FSDP engine, "exp_avg"/"exp_avg_sq" from AdamW, ...), one flat tensor per FSDP
// unit laid out like that unit's shard on this rank (ShardPlan chunk). Checkpoints ask each
// component for its kinds instead of knowing what an engine or an optimizer keeps.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tessera {

struct NamedShards {
  std::string kind;
  std::vector<at::Tensor> per_unit;
};

}  // namespace tessera
