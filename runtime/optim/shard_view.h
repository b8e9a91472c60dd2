// What one optimizer step works on, as the engine hands it over (fsdp::Engine::optimizer_view):
// every unit's shard (fp32 master, reduced gradient, weight-decay ranges) and the group the shards
// are split over, whose ranks the global gradient norm sums. The trainer neither pulls gradients
// out of the engine nor rebuilds shards for the optimizer.
//
// clip() is where the step's device difference lives: with AdamW's fused CPU loop the norm is taken
// on the host and clipping folds into AdamW's one pass (a coefficient, the gradients untouched);
// on a GPU whose shards a fused kernel updates, the norm and the coefficient stay on the device and
// the kernel multiplies by it as it reads each gradient (AdamW::folds_clipping; train.device_step on
// a CPU the same, its loop standing for the kernel); with tensor ops (fused_device or fused_cpu off)
// the norm stays on the device and clipping scales the gradients there. Neither device way
// synchronises the host.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "runtime/optim/adamw.h"

namespace tessera::comm {
class Communicator;
}

namespace tessera::optim {

struct ShardView {
  std::vector<ParamShard> shards;
  comm::Communicator* group = nullptr;  // null or size 1: the norm is the local one
  // The engine's compute device: where clip() leaves the norm (the loss is there), also when the
  // shards live in host memory (fsdp.offload).
  at::Device device = at::kCPU;
  // The gradient shards (the same tensors as shards[i].grad: in-place changes reach the step).
  std::vector<at::Tensor> grads() const;
};

struct Clipped {
  at::Tensor norm;         // the global gradient norm before clipping: 0-dim double, on view.device
  float grad_scale = 1.0f; // for AdamW::step: the clipping coefficient when the CPU loop folds it, else 1
  at::Tensor device_scale; // for AdamW::step: the coefficient on the device when a GPU kernel folds it
};

// The global gradient norm and clipping at `max_norm` (<= 0: the norm only), folded into
// `optimizer`'s update where it can take the coefficient (its CPU loop, or a fused kernel on the
// device), else applied to the gradients. Collective over view.group.
Clipped clip(const ShardView& view, double max_norm, const AdamW& optimizer);

}  // namespace tessera::optim
