#include "runtime/optim/shard_view.h"

#include <ATen/ATen.h>

#include "runtime/optim/clip.h"

namespace tessera::optim {

std::vector<at::Tensor> ShardView::grads() const {
  std::vector<at::Tensor> out;
  out.reserve(shards.size());
  for (const ParamShard& s : shards) out.push_back(s.grad);
  return out;
}

namespace {
bool on_cpu(const ShardView& view) {
  for (const ParamShard& s : view.shards)
    if (s.param.defined()) return s.param.device().is_cpu();
  return true;
}
}  // namespace

Clipped clip(const ShardView& view, double max_norm, const AdamW& optimizer) {
  std::vector<at::Tensor> grads = view.grads();
  Clipped c;
  const optim::AdamWOptions& o = optimizer.options();
  if (o.fused_cpu && !o.cpu_stands_for_device && on_cpu(view)) {  // the host's norm; AdamW's pass multiplies by it
    const double norm = global_grad_norm(grads, view.group);
    c.norm = at::scalar_tensor(norm, at::kDouble).to(view.device);  // a copy up only under offload on a GPU
    c.grad_scale = static_cast<float>(clip_coefficient(norm, max_norm));
  } else if (max_norm > 0 && optimizer.folds_clipping(view.shards, view.device)) {
    c.norm = grad_norm_on_device(grads, view.group);
    c.device_scale = clip_coefficient_on_device(c.norm, max_norm);
  } else {
    c.norm = clip_grad_norm_on_device(grads, max_norm, view.group).to(view.device);
  }
  return c;
}

}  // namespace tessera::optim
