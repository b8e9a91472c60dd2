// AdamW on flat fp32 shards (each rank updates only the slice of each FSDP unit it owns). The
// optimizer owns its state: two moments per shard, allocated on first use (an evaluation never
// allocates them), in `state_dtype` (fp32, or bf16 to go below 16 bytes per parameter).
//
// The math is torch::optim::AdamW's (LibTorch 1.13, amsgrad off), per element:
//   t += 1 (one counter for all shards: every shard takes every step)
//   p *= 1 - lr * weight_decay                      (decoupled decay, only inside the decay ranges)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// On the CPU it runs as ONE pass over (p, g, m, v) per element, in parallel blocks, with no
// temporary larger than a few scalars per element; elsewhere (a GPU) the same formula runs as
// multi-tensor (_foreach_) ops over groups of shard pieces of at most group_elems elements in all:
// about ten operations per group (a handful per step for most models, against several per 1M-element
// block before), and no temporary larger than a group (fp32: the denominator, and the clipped
// gradient when clipping applies; bf16 moments add their two fp32 copies). The update is
// elementwise, so a sharded run and an unsharded one agree bit for bit; against torch's own AdamW
// (a sequence of whole-tensor ops) results agree to float rounding.
//
// bf16 state: m and v are stored in bf16 and widened to fp32 for each element's update, then
// rounded to nearest-even once. Equivalent to the fp32 run within the tolerance stated in
// tests/mpi/test_fsdp_train.cpp (BelowSixteenBytes).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/named_shards.h"

namespace tessera::optim {

struct AdamWOptions {
  double lr = 3e-4;  // default lr; step() takes the scheduled lr explicitly
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  at::ScalarType state_dtype = at::kFloat;  // moments: kFloat or kBFloat16
  bool fused_cpu = true;  // CPU shards: the one-pass loop (false: the tensor-op path; for tests)
  int64_t group_elems = int64_t(1) << 25;  // tensor-op path: elements per group (32M: 128 MiB per fp32 temporary)
};

// Elements [first, first + second) of a flat shard.
using Range = std::pair<int64_t, int64_t>;

// One flat shard as the optimizer sees it: all the same numel, param/grad float32 on one device.
struct ParamShard {
  at::Tensor param;          // fp32 master shard, updated in place
  at::Tensor grad;           // fp32 gradient shard; undefined -> the shard is skipped this step
  std::vector<Range> decay;  // where weight decay applies (sorted, disjoint); empty: nowhere
};

class AdamW {
 public:

  explicit AdamW(AdamWOptions options);

  // Increments the step count, then updates every shard with learning rate `lr`. Each gradient
  // element is multiplied by `grad_scale` as it is read (gradient clipping folded into the one pass:
  // the same float product torch's clip_grad_norm_ stores, so the result is the same bits as
  // clipping the gradients first); the gradients themselves are left as they are.
  void step(const std::vector<ParamShard>& shards, double lr, float grad_scale = 1.0f);

  // The moments ("exp_avg", "exp_avg_sq") of every shard (per_unit[i] belongs to shards[i]),
  // allocated (zeros) where not yet: for checkpoints, which read or fill them. `shards` gives each
  // shard's numel and device.
  std::vector<NamedShards> state(const std::vector<ParamShard>& shards);
  // Bytes of state per parameter element (8 for fp32 moments, 4 for bf16).
  int64_t state_bytes_per_element() const;

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }  // for checkpoint resume
  const AdamWOptions& options() const { return options_; }

 private:
  void ensure_state(const std::vector<ParamShard>& shards);
  // The tensor-op path's views of shard i's decayed ranges, made once (views are operator
  // dispatches too) and made again only if the shard's storage, size or ranges change.
  struct DecayViews {
    const void* data = nullptr;
    int64_t numel = -1;
    std::vector<Range> ranges;
    std::vector<at::Tensor> views;
  };
  const std::vector<at::Tensor>& decay_views_of(size_t i, const ParamShard& s);
  AdamWOptions options_;
  int64_t step_count_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  std::vector<DecayViews> decay_views_;
};

at::ScalarType parse_state_dtype(const std::string& s);  // fp32 | bf16; Error(Input) otherwise

}  // namespace tessera::optim
