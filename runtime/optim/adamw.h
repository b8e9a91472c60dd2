// AdamW on flat fp32 shards (each rank updates only the slice of each FSDP unit it owns).
//
// The math is exactly torch::optim::AdamW's (LibTorch 1.13, amsgrad off), per element:
//   t += 1 (one counter for all shards: every shard takes every step)
//   p *= 1 - lr * weight_decay                      (decoupled decay, only where decay_mask = 1)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// expressed with the same tensor ops in the same order, so results agree with torch to rounding
// (and bit-for-bit between a sharded and an unsharded run, since the update is elementwise).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::optim {

struct AdamWOptions {
  double lr = 3e-4;  // default lr; step() takes the scheduled lr explicitly
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// One flat shard and its optimizer state; all tensors have the same numel, dtype float32 and device.
struct ShardState {
  at::Tensor param;       // fp32 master shard, updated in place
  at::Tensor grad;        // fp32 gradient shard; undefined -> the shard is skipped this step
  at::Tensor exp_avg;     // first moment (zeros initially; see init_state)
  at::Tensor exp_avg_sq;  // second moment
  at::Tensor decay_mask;  // float 1 = apply weight decay, 0 = not (norms, biases); undefined = decay all
};

// Allocates zeroed exp_avg / exp_avg_sq shaped like `s.param` (no-op for those already defined).
void init_state(ShardState& s);

class AdamW {
 public:
  explicit AdamW(AdamWOptions options) : options_(options) {}

  // Increments the step count, then updates every shard with learning rate `lr`.
  void step(std::vector<ShardState*>& shards, double lr);

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }  // for checkpoint resume
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  int64_t step_count_ = 0;
};

}  // namespace tessera::optim
